# zoe-sglang-rocm: a Ray worker that runs SGLang on ROCm (docker/images.yaml).
#   pip wheel --no-deps -w dist . kernels/ && docker build -f docker/zoe-sglang-rocm.Dockerfile -t zoe-sglang-rocm:VERSION .
# SGLang's interpreter (Python 3.10 in the rocm720 images) gets zoe-kernels (its plugin entry point)
# without dependencies, so the image's ROCm torch and triton stay. Ray and zoe-cluster need ZOE_PYTHON,
# the zoe image's Python (one Python per Ray cluster): it comes from the deadsnakes PPA (the image is
# Ubuntu 22.04) into the venv /opt/zoe. `ray` and `zoe` are linked onto PATH; `python3` on PATH stays
# SGLang's, which is how zoe starts the engine (`python3 -m sglang.launch_server`).
ARG BASE_IMAGE=lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910
FROM ${BASE_IMAGE}
ARG ZOE_PYTHON=3.12

RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python${ZOE_PYTHON} python${ZOE_PYTHON}-venv \
    && rm -rf /var/lib/apt/lists/*

COPY constraints.txt /tmp/zoe/
COPY dist/zoe_cluster-*.whl dist/zoe_kernels-*.whl /tmp/zoe/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/zoe/zoe_kernels-*.whl \
    && python${ZOE_PYTHON} -m venv /opt/zoe \
    && /opt/zoe/bin/pip install --no-cache-dir -c /tmp/zoe/constraints.txt /tmp/zoe/zoe_cluster-*.whl \
    && ln -s /opt/zoe/bin/ray /opt/zoe/bin/zoe /usr/local/bin/ \
    && rm -rf /tmp/zoe \
    && python3 -c "import zoe_kernels.integrations.sglang_hook" \
    && zoe --version && ray --version
