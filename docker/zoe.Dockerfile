# zoe: the controller, the router and the `zoe` CLI (docker/images.yaml). No engine, no torch.
#   pip wheel --no-deps -w dist . && docker build -f docker/zoe.Dockerfile -t zoe:VERSION .
FROM python:3.12-slim-bookworm

COPY constraints.txt /tmp/zoe/
COPY dist/zoe_cluster-*.whl /tmp/zoe/
RUN python -m pip install --no-cache-dir -c /tmp/zoe/constraints.txt /tmp/zoe/zoe_cluster-*.whl \
    && rm -rf /tmp/zoe \
    && zoe --version

CMD ["zoe", "--help"]
