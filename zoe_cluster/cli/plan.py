"""`zoe plan MODEL --concurrency N [--context TOKENS] [--nodes K] [--speculative] [--json]`."""

from __future__ import annotations

import typer
from rich.table import Table

from zoe_cluster.cli.common import console, fail, print_json
from zoe_cluster.cli.recipes import load_or_exit
from zoe_cluster.planner import Demand, NoFeasibleVariant, plan


def plan_cmd(
    model: str = typer.Argument(..., help="Model id, e.g. glm-5.3 (see `zoe recipes list`)."),
    concurrency: int = typer.Option(..., "--concurrency", "-c", help="Concurrent requests expected."),
    context: int = typer.Option(8192, "--context", help="Typical context length per request, tokens."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes available."),
    speculative: bool = typer.Option(False, "--speculative", help="Also consider speculative-decoding variants."),
    prompt: str = typer.Option("apex", "--prompt", help="Which measured prompt's decode table to use (apex|gsm8k)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Choose a variant and replica count for a demand, from the seed's measured profiles."""
    recipe = load_or_exit(model)
    try:
        p = plan(recipe, Demand(concurrency, context, nodes, speculative, prompt))
    except (NoFeasibleVariant, ValueError) as e:
        fail(str(e))
    if json_out:
        return print_json(p.to_dict())
    console.print(f"[bold]{p.model}[/]: serve [bold green]{p.variant}[/] x {p.replicas} replica(s) "
                  f"({p.engine}, {p.quantization}, TP{p.tp} DP{p.dp}, kernels: {', '.join(p.kernels) or 'none'})")
    console.print(p.reason.replace("; ", "\n"), highlight=False)
    t = Table(title="all variants")
    for col in ("variant", "eligible", "tok/s/node", "tok/s/user", "TTFT s", "why / source"):
        t.add_column(col)
    rows = [c for c in p.alternatives]
    for c in rows:
        fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        t.add_row(c.variant, "yes" if c.eligible else "no", fmt(c.decode_tok_s_per_node), fmt(c.decode_tok_s_per_user),
                  "-" if c.ttft_s is None else f"{c.ttft_s:.2f}", c.source if c.eligible else c.why)
    console.print(t)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
