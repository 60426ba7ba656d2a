"""How close `zoe bench`, measuring zoe's simulated engine from the client side, comes to the seed's own
numbers: prefill TTFT by length x hit rate (seed table A5) and per-node decode tok/s (seed table A7, MTP off),
for the GLM-5.3 vLLM baseline (fp8-tp8) and ZOE (fp8-tp8-zoe) example reports in this folder.

    .venv/bin/python bench/serving/seed_agreement.py   # prints a markdown table, writes sim-glm53-vs-seed.json

The seed's numbers are read from the recipe (recipes/glm-5.3.yaml, each with its table id), never retyped."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from zoe_cluster.bench.report import load_report
from zoe_cluster.recipes.loader import RecipeRegistry

HERE = Path(__file__).resolve().parent
PAIRS = {"fp8-tp8": "baseline", "fp8-tp8-zoe": "zoe"}


def main() -> None:
    recipe = RecipeRegistry.default().get("glm-5.3")
    cells: list[dict] = []
    lines = ["| variant | cell | seed | zoe bench on the sim | error | source |", "|---|---|---|---|---|---|"]
    for variant, tag in PAIRS.items():
        prefill = load_report(HERE / f"sim-glm53-prefill-{tag}.json")
        measured = {(r["input_len"], r["hit_rate_target"]): r["ttft_s"]["mean"] for r in prefill.rows}
        for p in recipe.ttft_points(variant):
            got = measured.get((p.input_tokens, p.hit_rate))
            if got is not None:
                cells.append(dict(variant=variant, kind="ttft_s", cell=f"{p.input_tokens // 1024}K @ {p.hit_rate:.0%}",
                                  seed=p.ttft_s.value, bench=got, source=p.ttft_s.source))  # fmt: skip
        decode = load_report(HERE / f"sim-glm53-decode-{tag}.json")
        measured = {r["concurrency"]: r["per_node_tok_s"]["mean"] for r in decode.rows}
        for p in recipe.variant(variant).profile.decode:
            got = measured.get(p.concurrency)
            if got is not None and p.prompt == "apex":
                cells.append(dict(variant=variant, kind="decode_tok_s_per_node", cell=f"C={p.concurrency}",
                                  seed=p.tok_s_per_node.value, bench=got, source=p.tok_s_per_node.source))  # fmt: skip
    for c in cells:
        c["error_pct"] = 100.0 * (c["bench"] - c["seed"]) / c["seed"]
        lines.append(f"| {c['variant']} | {c['kind']} {c['cell']} | {c['seed']:.4g} | {c['bench']:.4g} | "
                     f"{c['error_pct']:+.1f}% | {c['source']} |")  # fmt: skip
    abs_err = [abs(c["error_pct"]) for c in cells]
    summary = {"cells": len(cells), "median_abs_error_pct": statistics.median(abs_err),
               "max_abs_error_pct": max(abs_err)}
    (HERE / "sim-glm53-vs-seed.json").write_text(json.dumps(
        {"command": "python bench/serving/seed_agreement.py", "summary": summary, "cells": cells}, indent=2) + "\n")
    print("\n".join(lines))
    print(f"\n{summary['cells']} cells: median |error| {summary['median_abs_error_pct']:.1f}%, "
          f"max {summary['max_abs_error_pct']:.1f}%")


if __name__ == "__main__":
    main()
