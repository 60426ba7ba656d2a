"""Every recipe variant's command line passes the engine's REAL argument parser (vLLM 0.32 / SGLang 0.5.23).

The parsers run in the engines' own test venvs (scripts/setup_test_envs.sh); each venv parses all variants in
one subprocess, so the slow imports happen once.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from zoe_cluster.engines import LaunchContext, get_adapter
from zoe_cluster.recipes import RecipeRegistry

REG = RecipeRegistry.default()
CHECK = Path(__file__).with_name("real_parser_check.py")
LAUNCHER = {"vllm": 2, "sglang": 3}  # argv words before the engine's own flags: `vllm serve` / `python3 -m ...`


def _variants(engine: str):
    return [(r, name) for r in REG.all() for name, v in r.variants.items() if v.engine == engine]


def _ctx(**kw) -> LaunchContext:
    base = dict(gpu_ids=(0, 1, 2, 3, 4, 5, 6, 7), platform="rocm", host="127.0.0.1", port=8100,
                served_model_name="m")
    return LaunchContext(**{**base, **kw})


def _parse(python: str, engine: str, argvs: list[list[str]]) -> list[dict]:
    # With HF_HUB_OFFLINE set, vLLM's EngineArgs resolves the model id to a local snapshot, which a parser
    # check of recipe checkpoints (never downloaded here) must not need; parsing itself makes no request.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([python, str(CHECK)], input=json.dumps({"engine": engine, "argvs": argvs}),
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _strip(engine: str, argv: list[str]) -> list[str]:
    return argv[LAUNCHER[engine]:]


def _assert_parsed_as_the_recipes_say(cases, results) -> None:
    """Every variant's argv parsed, and its parsers and remote-code flag reached the engine as the recipe sets them."""
    for (r, name), got in zip(cases, results):
        assert got["ok"], f"{r.name}/{name}: {got['error']}"
        v = r.variants[name]
        parsed = {k: got["values"][k] for k in ("tool_call_parser", "reasoning_parser", "trust_remote_code")}
        assert parsed == {"tool_call_parser": v.tool_call_parser, "reasoning_parser": v.reasoning_parser,
                          "trust_remote_code": v.trust_remote_code}, f"{r.name}/{name}"


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag`'s value changed (the flag must be there)."""
    i = argv.index(flag)
    return argv[:i + 1] + [value] + argv[i + 2:]


@pytest.mark.vllm
def test_every_vllm_variant_passes_vllms_parser(vllm_python):
    cases = _variants("vllm")
    adapter = get_adapter("vllm")
    argvs = [_strip("vllm", adapter.command(r, name, _ctx(served_model_name=r.served_model_name)).argv)
             for r, name in cases]
    # and a broken one, to show the check can fail
    argvs.append(argvs[0] + ["--max-num-seqz", "4"])
    argvs.append(argvs[0] + ["--kv-cache-dtype", "fp7"])
    argvs.append(argvs[0] + ["--speculative-config", '{"method":"telepathy","num_speculative_tokens":2}'])
    # a host KV tier of 2000 GB per replica: vLLM's native CPU offloading, sized in GiB over the replica's ranks
    r0, n0 = cases[0]
    argvs.append(_strip("vllm", adapter.command(r0, n0, _ctx(served_model_name=r0.served_model_name,
                                                             host_kv_gb=2000)).argv))
    # parser names vLLM has not registered: its argument parser takes any string, its registries do not
    argvs.append(_replace(argvs[0], "--tool-call-parser", "glm5000"))
    argvs.append(_replace(argvs[0], "--reasoning-parser", "glm5000"))
    res = _parse(vllm_python, "vllm", argvs)
    _assert_parsed_as_the_recipes_say(cases, res)
    for (r, name), got in zip(cases, res):
        assert got["values"]["kv_offloading_size"] is None  # HBM only unless asked
        assert got["values"]["enable_auto_tool_choice"] is bool(r.variants[name].tool_call_parser)
    assert [g["ok"] for g in res[len(cases):len(cases) + 3]] == [False, False, False], res[len(cases):]
    assert "max-num-seqz" in res[len(cases)]["error"]
    host = res[len(cases) + 3]
    assert host["ok"], host["error"]
    assert host["values"]["kv_offloading_size"] == pytest.approx(2000e9 / 2**30, abs=0.1)
    assert host["values"]["kv_offloading_backend"] == "native"
    bad_tool, bad_reasoning = res[len(cases) + 4:]
    assert not bad_tool["ok"] and "glm5000" in bad_tool["error"], bad_tool
    assert not bad_reasoning["ok"] and "glm5000" in bad_reasoning["error"], bad_reasoning


@pytest.mark.sglang
def test_every_sglang_variant_passes_sglangs_parser(sglang_python):
    cases = _variants("sglang")
    adapter = get_adapter("sglang")
    argvs = [_strip("sglang", adapter.command(r, name, _ctx(served_model_name=r.served_model_name)).argv)
             for r, name in cases]
    # multi-node form of the first variant (SGLang joins nodes itself)
    r0, n0 = cases[0]
    argvs.append(_strip("sglang", adapter.command(r0, n0, _ctx(nnodes=2, node_rank=1,
                                                               dist_init_addr="10.0.0.1:5000")).argv))
    argvs.append(argvs[0] + ["--tp-size", "eight"])
    argvs.append(argvs[0] + ["--speculative-algorithm", "TELEPATHY"])
    # a host KV tier of 2000 GB per replica: HiCache, whole GB per rank
    argvs.append(_strip("sglang", adapter.command(r0, n0, _ctx(served_model_name=r0.served_model_name,
                                                               host_kv_gb=2000)).argv))
    # parser names SGLang has not registered
    argvs.append(_replace(argvs[0], "--tool-call-parser", "kimi_k5000"))
    argvs.append(_replace(argvs[0], "--reasoning-parser", "kimi_k5000"))
    res = _parse(sglang_python, "sglang", argvs)
    _assert_parsed_as_the_recipes_say(cases, res)
    for (r, name), got in zip(cases, res):
        assert got["values"]["enable_hierarchical_cache"] is False
    assert res[len(cases)]["ok"], res[len(cases)]
    assert [g["ok"] for g in res[len(cases) + 1:len(cases) + 3]] == [False, False]
    host = res[len(cases) + 3]
    ranks = r0.variants[n0].parallelism.tp * r0.variants[n0].parallelism.pp * r0.variants[n0].parallelism.dp
    assert host["ok"], host["error"]
    assert host["values"]["enable_hierarchical_cache"] is True and host["values"]["hicache_size"] == 2000 // ranks
    bad_tool, bad_reasoning = res[len(cases) + 4:]
    assert not bad_tool["ok"] and "kimi_k5000" in bad_tool["error"], bad_tool
    assert not bad_reasoning["ok"] and "kimi_k5000" in bad_reasoning["error"], bad_reasoning


def test_gpu_ids_are_exported_per_platform_and_kernels_set():
    glm = REG.get("glm-5.3")
    rocm = get_adapter("vllm").command(glm, "fp8-tp8-zoe", _ctx(gpu_ids=(4, 5, 6, 7)))
    assert rocm.env["HIP_VISIBLE_DEVICES"] == "4,5,6,7" and "CUDA_VISIBLE_DEVICES" not in rocm.env
    assert rocm.env["ZOE_KERNELS"] == "fused_moe,lightning_indexer"
    cuda = get_adapter("vllm").command(glm, "fp8-tp8", _ctx(platform="cuda", gpu_ids=(0, 1)))
    assert cuda.env["CUDA_VISIBLE_DEVICES"] == "0,1" and "ZOE_KERNELS" not in cuda.env
    argv = rocm.argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8" and "--enable-prefix-caching" in argv


def test_multinode_vllm_runs_one_server_and_sglang_one_per_node():
    glm = REG.get("glm-5.3")
    assert get_adapter("vllm").command(glm, "fp8-tp8", _ctx(nnodes=2, node_rank=1)).argv == []
    head = get_adapter("vllm").command(glm, "fp8-tp8", _ctx(nnodes=2, node_rank=0)).argv
    assert head[head.index("--distributed-executor-backend") + 1] == "ray"
    v4 = REG.get("deepseek-v4-pro")
    with pytest.raises(ValueError, match="dist_init_addr"):
        get_adapter("sglang").command(v4, "fp8-tp8", _ctx(nnodes=2, node_rank=1))


def test_wrong_engine_for_variant_is_refused():
    with pytest.raises(ValueError, match="is a sglang variant, not vllm"):
        get_adapter("vllm").command(REG.get("kimi-k3"), "mxfp4-tp8-dspark", _ctx())
    with pytest.raises(ValueError, match="unknown engine"):
        get_adapter("tgi")


def test_parsers_and_remote_code_follow_the_recipe():
    """Tool calling and thinking are switched on per model card; remote code only where the card asks for it."""
    glm = get_adapter("vllm").command(REG.get("glm-5.3"), "fp8-tp8", _ctx()).argv
    assert glm[glm.index("--tool-call-parser") + 1] == "glm47" and "--enable-auto-tool-choice" in glm
    assert glm[glm.index("--reasoning-parser") + 1] == "glm45" and "--trust-remote-code" not in glm
    kimi = get_adapter("sglang").command(REG.get("kimi-k3"), "mxfp4-tp8-dspark", _ctx()).argv
    assert kimi[kimi.index("--tool-call-parser") + 1] == "kimi_k3" and "--trust-remote-code" in kimi
    assert "--enable-auto-tool-choice" not in kimi  # a vLLM flag; SGLang offers tools whenever a parser is set
    bare = REG.get("glm-5.3").model_copy(deep=True)
    v = bare.variants["fp8-tp8"]
    object.__setattr__(v, "tool_call_parser", None)
    object.__setattr__(v, "reasoning_parser", None)
    argv = get_adapter("vllm").command(bare, "fp8-tp8", _ctx()).argv
    assert not {"--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser"} & set(argv)
