"""Merging a partial AOT compile (`python -m zoe_kernels.aot --only ... --merge REPORT`) into a committed report.

Kept apart from `aot.py`, which turns Triton's interpreter off when imported: the tests import this in-process.
"""

from __future__ import annotations


def merge_rows(old: list[dict], new: list[dict], only: str, archs: list[str]) -> list[dict]:
    """A report's rows with those of the cases named by `only` compiled again for `archs`: every old row of those
    archs whose cases all contain `only` gives way to the rows of `new` (a run with `--only only --arch archs`); the
    rest stay. Not-applicable rows (no `cases`) are kept once per (arch, kernel), and the run's own are added, so a
    Gluon kernel added since the report was made gets its row.
    An old row that some matching and some other cases share cannot be split: a ValueError asks for a wider `only`."""
    kept = []
    for row in old:
        cases = row.get("cases")
        if cases is None or row["arch"] not in archs:  # a not-applicable row, or an arch not compiled again
            kept.append(row)
            continue
        matching = [c for c in cases if only in c]
        if matching and len(matching) < len(cases):
            raise ValueError(f"{row['arch']} {row['kernel']} [{row['config']}] serves cases in and out of "
                             f"--only {only!r} ({matching[0]!r}, {next(c for c in cases if only not in c)!r}): "
                             "compile a filter that takes all of its cases")
        if not matching:
            kept.append(row)
    have = {(r["arch"], r["kernel"]) for r in kept if r.get("cases") is None}
    merged = kept + [r for r in new if r.get("cases") is not None or (r["arch"], r["kernel"]) not in have]
    merged.sort(key=lambda r: (r["arch"], r["kernel"], r["config"]))
    return merged
