#!/usr/bin/env bash
# Installs the peer routers the router benchmarks compare zoe against (not needed by the tests or CI):
#   $PEERS/venv  PyPI sglang-router 0.3.2: sglang-router's cache_aware policy (bench/router/live_compare.py,
#                bench/agentic/live_compare.py, bench/router/overhead.py: --peer-python $PEERS/venv/bin/python)
#   $PEERS/smg   PyPI smg 1.13.0, the SGLang model gateway (bench/router/overhead.py: --smg $PEERS/smg/bin/smg);
#                its own venv, since sglang-router 0.3.2 installs an older `smg` command of its own
# PEERS defaults to /tmp/peers, the path the benchmarks default to. Each venv is skipped when its marker exists.
#   bash scripts/setup_peers.sh              # or: PEERS=/some/dir bash scripts/setup_peers.sh
set -euo pipefail
peers=${PEERS:-/tmp/peers}
mkdir -p "$peers"
log() { printf '\033[1m[peers]\033[0m %s\n' "$*"; }

peer_venv() {  # peer_venv DIR REQUIREMENT
  local dir=$1 req=$2
  if [ "$(cat "$dir/.zoe-peer" 2>/dev/null)" = "$req" ]; then
    return 0
  fi
  log "$req in $dir"
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check "$req"
  echo "$req" > "$dir/.zoe-peer"
}

peer_venv "$peers/venv" sglang-router==0.3.2
peer_venv "$peers/smg" smg==1.13.0
"$peers/venv/bin/python" -c "import sglang_router" && [ -x "$peers/smg/bin/smg" ]
log "ready: --peer-python $peers/venv/bin/python --smg $peers/smg/bin/smg"
