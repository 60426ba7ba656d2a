# zoe-vllm-rocm: a Ray worker that runs vLLM on ROCm (docker/images.yaml; the nightly variant is the same
# file with --build-arg BASE_IMAGE=<nightly tag>).
#   pip wheel --no-deps -w dist . kernels/ && docker build -f docker/zoe-vllm-rocm.Dockerfile -t zoe-vllm-rocm:VERSION .
# vLLM's interpreter gets zoe-kernels (its plugin entry point) without dependencies, so the image's ROCm
# torch and triton stay, and Ray at zoe's release (RAY_VERSION), which vLLM's Ray executor uses when a
# replica spans nodes. Ray and zoe-cluster go into the venv /opt/zoe on ZOE_PYTHON, the zoe image's
# Python, so every node of a Ray cluster runs one Python and one Ray. `ray` and `zoe` are linked onto
# PATH; `python3` and `vllm` on PATH stay the engine's, which is how zoe starts the engine.
ARG BASE_IMAGE=vllm/vllm-openai-rocm:v0.29.0
FROM ${BASE_IMAGE}
ARG ZOE_PYTHON=3.12
ARG RAY_VERSION=2.60.0

COPY constraints.txt /tmp/zoe/
COPY dist/zoe_cluster-*.whl dist/zoe_kernels-*.whl /tmp/zoe/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/zoe/zoe_kernels-*.whl \
    && python3 -m pip install --no-cache-dir "ray[default]==${RAY_VERSION}" \
    && python${ZOE_PYTHON} -m venv /opt/zoe \
    && /opt/zoe/bin/pip install --no-cache-dir -c /tmp/zoe/constraints.txt /tmp/zoe/zoe_cluster-*.whl \
    && ln -s /opt/zoe/bin/ray /opt/zoe/bin/zoe /usr/local/bin/ \
    && rm -rf /tmp/zoe \
    && python3 -c "import zoe_kernels.integrations.vllm_plugin" \
    && zoe --version && ray --version
