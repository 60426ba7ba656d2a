#!/usr/bin/env bash
# The test command (README.md): installs what the tests need (idempotent), then runs every tier.
#   bash scripts/test.sh                # everything, as CI does
#   bash scripts/test.sh tests/router   # extra arguments go to pytest
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash scripts/setup_test_envs.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1
export ZOE_TEST_ENVS=${ZOE_TEST_ENVS:-$HOME/.cache/zoe/test-envs}
exec .venv/bin/python -m pytest -q -ra --durations=15 "$@"
