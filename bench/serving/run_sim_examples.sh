#!/usr/bin/env bash
# Example `zoe bench` results against zoe's simulated engine: GLM-5.3 on MI355X, the vLLM v0.29.0 baseline
# (variant fp8-tp8) against the same with zoe's kernels (fp8-tp8-zoe), measured the way the seed measured
# Figures 14 (prefill TTFT by length x hit rate) and 16 (decode tok/s by concurrency), plus a Mooncake replay.
# Writes JSON + PNG next to this script. Needs about 30 minutes on a 2-core machine (the simulated engine runs
# at --time-scale 1.0 for prefill, 0.5 for decode, 0.1 for the trace; reports are in modelled seconds because
# the bench reads the time scale from /sim/info). The simulated engine keeps time on the wall clock, so a
# loaded machine (other processes delaying its event loop) shows up as longer times, most at short TTFTs.
#
#   bash bench/serving/run_sim_examples.sh            # everything
#   bash bench/serving/run_sim_examples.sh prefill    # one part: prefill | decode | trace
set -euo pipefail
cd "$(dirname "$0")/../.."
ZOE=${ZOE:-.venv/bin/zoe}
OUT=bench/serving
PORT_BASE=${PORT_BASE:-18301}
PORT_ZOE=${PORT_ZOE:-18302}
PARTS=${1:-prefill decode trace}
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

serve() {  # serve VARIANT PORT TIME_SCALE
  $ZOE sim serve --model glm-5.3 --variant "$1" --port "$2" --time-scale "$3" --startup-s 0 &
  PIDS+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$2/health" >/dev/null && return 0; sleep 0.2; done
  echo "sim $1 did not start" >&2; exit 1
}
stop_all() { cleanup; PIDS=(); }

for part in $PARTS; do
  case $part in
  prefill)
    serve fp8-tp8 $PORT_BASE 1.0; serve fp8-tp8-zoe $PORT_ZOE 1.0
    # Baseline and ZOE run at the same time on their own replicas (single requests: the client is mostly idle).
    $ZOE bench prefill --url http://127.0.0.1:$PORT_BASE --lengths 8k,16k,32k,64k,128k,256k \
      --hit-rates 0,0.6,0.9 --runs 5 --warmup 1 --seed 1 --label "vLLM baseline (sim)" \
      --out $OUT/sim-glm53-prefill-baseline.json &
    b=$!
    $ZOE bench prefill --url http://127.0.0.1:$PORT_ZOE --lengths 8k,16k,32k,64k,128k,256k \
      --hit-rates 0,0.6,0.9 --runs 5 --warmup 1 --seed 2 --label "ZOE (sim)" \
      --out $OUT/sim-glm53-prefill-zoe.json
    wait $b
    $ZOE bench compare $OUT/sim-glm53-prefill-baseline.json $OUT/sim-glm53-prefill-zoe.json \
      --plot $OUT/sim-glm53-prefill-compare.png | tee $OUT/sim-glm53-prefill-compare.txt
    stop_all ;;
  decode)
    # One after the other: 32 streams of 1024 tokens keep the client busy.
    serve fp8-tp8 $PORT_BASE 0.5
    $ZOE bench decode --url http://127.0.0.1:$PORT_BASE --concurrency 1,2,4,8,16,32 --output-len 1024 \
      --prompt apex --runs 3 --warmup 1 --label "vLLM baseline (sim)" --out $OUT/sim-glm53-decode-baseline.json
    stop_all
    serve fp8-tp8-zoe $PORT_ZOE 0.5
    $ZOE bench decode --url http://127.0.0.1:$PORT_ZOE --concurrency 1,2,4,8,16,32 --output-len 1024 \
      --prompt apex --runs 3 --warmup 1 --label "ZOE (sim)" --out $OUT/sim-glm53-decode-zoe.json
    stop_all
    $ZOE bench compare $OUT/sim-glm53-decode-baseline.json $OUT/sim-glm53-decode-zoe.json \
      --plot $OUT/sim-glm53-decode-compare.png | tee $OUT/sim-glm53-decode-compare.txt ;;
  trace)
    # The first 300 requests of the Mooncake conversation trace (102 s of a cluster's traffic) on ONE replica,
    # stretched 4x in modelled time (--time-scale 0.4 wall seconds per trace second at sim time scale 0.1)
    # so one replica is not overloaded.
    serve fp8-tp8 $PORT_BASE 0.1; serve fp8-tp8-zoe $PORT_ZOE 0.1
    for v in baseline zoe; do
      port=$PORT_BASE; label="vLLM baseline (sim)"
      [ $v = zoe ] && port=$PORT_ZOE && label="ZOE (sim)"
      $ZOE bench trace "$(cd "$(dirname "$0")/../.." && pwd)/third_party/traces/mooncake_conversation_trace.jsonl" --url http://127.0.0.1:$port \
        --limit 300 --time-scale 0.4 --seed 0 --label "$label" --out $OUT/sim-glm53-mooncake-$v.json
    done
    stop_all
    $ZOE bench compare $OUT/sim-glm53-mooncake-baseline.json $OUT/sim-glm53-mooncake-zoe.json \
      --plot $OUT/sim-glm53-mooncake-compare.png | tee $OUT/sim-glm53-mooncake-compare.txt ;;
  *) echo "unknown part $part (prefill | decode | trace)" >&2; exit 2 ;;
  esac
done
