"""How much replay's figures move when the sessions' timing moves a little: the setup of `live_compare.py
--sessions 12 --kv-tokens 300000` replayed with the think-time cap shifted by up to +/-0.1 s, for each policy. If
tight-KV replay were chaotic (a chain kept or evicted on milliseconds), these would spread as live runs do.

    python bench/agentic/replay_sensitivity.py     # writes bench/agentic/replay_sensitivity.json

Each row is `zoe sim replay <the 14 small sessions> --sessions 12 --model glm-5.3 --replicas 4 --policy P
--think-cap-s C --kv-tokens 300000 --json`, in-process with the router's slow-replica ejection at its default factor
(as `live_compare.py` replays).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from live_compare import COMPARED, SMALL, session_dir  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--policies", default="prefix,session_hash")
    ap.add_argument("--think-caps", default="9.9,9.95,10.0,10.05,10.1")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--kv-tokens", type=int, default=300000)
    ap.add_argument("--out", default=str(HERE / "replay_sensitivity.json"))
    args = ap.parse_args()
    from zoe_cluster.agentic.options import SessionOptions
    from zoe_cluster.agentic.replay import replay_sessions
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.router.config import RouterConfig

    recipe = RecipeRegistry.default().get("glm-5.3")
    sessions = session_dir(Path(args.sessions_dir), SMALL.split(","))
    slow_factor = RouterConfig.model_fields["slow_factor"].default
    rows, spread = [], {}
    for policy in args.policies.split(","):
        mine = []
        for cap in (float(c) for c in args.think_caps.split(",")):
            opts = SessionOptions(args.sessions, think_cap_s=cap, max_input_tokens=recipe.architecture.max_context_tokens)
            rep = replay_sessions(recipe, recipe.default_variant, opts.driver(sessions), 4, policy,
                                  kv_tokens=args.kv_tokens, slow_factor=slow_factor)
            row = {"policy": policy, "think_cap_s": cap, "slow_ejections": rep["slow_ejections"],
                   **{k: rep[k] for k in COMPARED}}
            rows.append(row)
            mine.append(row)
            print(json.dumps(row), flush=True)
        spread[policy] = {k: (max(r[k] for r in mine) - min(r[k] for r in mine)) / (sum(r[k] for r in mine) / len(mine))
                          for k in COMPARED}
    doc = {"command": "python bench/agentic/replay_sensitivity.py " + " ".join(sys.argv[1:]),
           "setup": {"files": SMALL.split(","), "live_sessions": args.sessions, "replicas": 4, "model": "glm-5.3",
                     "kv_tokens_per_replica": args.kv_tokens, "slow_factor": slow_factor},
           "runs": rows, "spread": spread}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(spread, indent=1))


if __name__ == "__main__":
    main()
