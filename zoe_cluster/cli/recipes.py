"""`zoe recipes list|show|validate`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from zoe_cluster.cli.common import console, err_console, fail, print_json
from zoe_cluster.recipes import RecipeError, RecipeRegistry, UnknownModelError, load_recipe_file

recipes_app = typer.Typer(help="List, show and validate model recipes.", no_args_is_help=True)


def load_or_exit(model: str):
    """The recipe of `model`, or exit non-zero naming the known models / the broken field."""
    try:
        return RecipeRegistry.default().get(model)
    except UnknownModelError as e:
        fail(str(e))
    except RecipeError as e:
        fail(str(e))


@recipes_app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Models zoe has recipes for, with their variants."""
    reg = RecipeRegistry.default()
    rows = []
    for name in reg.names():
        r = load_or_exit(name)
        rows.append({"model": r.name, "display_name": r.display_name, "attention": r.architecture.attention,
                     "default_variant": r.default_variant, "variants": list(r.variants)})
    if json_out:
        return print_json(rows)
    t = Table(title="zoe recipes")
    for col in ("model", "attention", "default variant", "variants"):
        t.add_column(col)
    for row in rows:
        t.add_row(row["model"], row["attention"], row["default_variant"], ", ".join(row["variants"]))
    console.print(t)


@recipes_app.command("show")
def show_cmd(model: str, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """A model's architecture and every variant with its measured profile."""
    r = load_or_exit(model)
    if json_out:
        return print_json(r.model_dump(mode="json"))
    a = r.architecture
    console.print(f"[bold]{r.display_name}[/] ({r.name}): {a.attention.upper()} attention, {a.num_moe_layers}/"
                  f"{a.num_layers} MoE layers, {a.routed_experts} routed + {a.shared_experts} shared experts, "
                  f"top-{a.experts_per_token}, max context {a.max_context_tokens:,} tokens")
    t = Table()
    for col in ("variant", "engine", "weights", "GPUs", "kernels", "spec", "decode tok/s/node (c: value)", "source"):
        t.add_column(col)
    for name, v in r.variants.items():
        p = v.parallelism
        dec = ", ".join(f"{d.concurrency}: {d.tok_s_per_node.value:g}" for d in v.profile.decode if d.prompt == "apex")
        dec = dec or ", ".join(f"{c.context_tokens // 1024}K ctx: {c.tok_s_per_user.value:g}/user"
                               for c in v.profile.context_decode)
        srcs = sorted({d.tok_s_per_node.source for d in v.profile.decode} |
                      {c.tok_s_per_user.source for c in v.profile.context_decode})
        t.add_row(name + (" (default)" if name == r.default_variant else ""), v.engine,
                  f"{v.weights.quantization} {v.weights.size_gb.value:g} GB", f"TP{p.tp}xDP{p.dp}xPP{p.pp} x{p.nodes}n",
                  ",".join(v.kernels) or "-", v.speculative.method if v.speculative else "-", dec, "; ".join(srcs))
    console.print(t)


@recipes_app.command("validate")
def validate_cmd(paths: list[Path] = typer.Argument(..., help="Recipe YAML files.")) -> None:
    """Check recipe files; exits non-zero naming the file, the field path and why for each problem."""
    bad = 0
    for path in paths:
        try:
            r = load_recipe_file(path)
            console.print(f"[green]ok[/] {path} ({r.name}: {len(r.variants)} variants)")
        except RecipeError as e:
            bad += 1
            err_console.print(f"[red]invalid[/] {e}", highlight=False, soft_wrap=True)
    if bad:
        raise SystemExit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(recipes_app, name="recipes")
