"""Runs INSIDE an engine's test venv: parses argv lists with the engine's real argument parser.

stdin: JSON {"engine": "vllm"|"sglang", "argvs": [[...], ...]} (argv without the launcher);
stdout (last line): JSON list of {"ok": bool, "error": str, "values": {...}} (a few parsed settings zoe sets).
"""

import contextlib
import io
import json
import sys
import typing


def _flatten_literal(tp) -> set:
    out = set()
    for arg in typing.get_args(tp):
        out |= _flatten_literal(arg) if typing.get_args(arg) else {arg}
    return out


def _error(e: BaseException, stderr: io.StringIO) -> str:
    """argparse's message (its last stderr line) for a usage error, else the exception itself."""
    if isinstance(e, SystemExit):
        return (stderr.getvalue().strip().splitlines() or [repr(e)])[-1]
    return repr(e)


def _kv_events(cfg):
    """The KV-event publisher settings an engine parsed (None: no KV events)."""
    if cfg is None:
        return None
    return {k: getattr(cfg, k, None) for k in ("enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint",
                                               "topic")}


def _sglang_kv_events(text):
    if not text:
        return None
    from sglang.srt.disaggregation.kv_events import KVEventsConfig

    return _kv_events(KVEventsConfig.from_cli(text))  # what SGLang's scheduler builds its publisher from


def check_vllm(argvs):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.config.speculative import SpeculativeMethod
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    methods = _flatten_literal(SpeculativeMethod)
    results = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
                validate_parsed_serve_args(args)
                eng = EngineArgs.from_cli_args(args)
            spec = eng.speculative_config or {}
            if spec and spec.get("method") not in methods:
                raise ValueError(f"speculative method {spec.get('method')!r} not in vLLM's {sorted(methods)}")
            if eng.quantization and eng.quantization not in QUANTIZATION_METHODS:
                raise ValueError(f"unknown quantization {eng.quantization!r}")
            # vLLM looks parser names up only when the server starts: resolve them in its registries (the lookup
            # imports the parser's module) so a misspelled name fails here.
            if args.tool_call_parser:
                ToolParserManager.get_tool_parser(args.tool_call_parser)
            if eng.reasoning_parser:
                ReasoningParserManager.get_reasoning_parser(eng.reasoning_parser)
            results.append({"ok": True, "error": "", "values": {
                "kv_offloading_size": eng.kv_offloading_size, "kv_offloading_backend": eng.kv_offloading_backend,
                "tool_call_parser": args.tool_call_parser, "enable_auto_tool_choice": args.enable_auto_tool_choice,
                "reasoning_parser": eng.reasoning_parser or None, "trust_remote_code": eng.trust_remote_code,
                "long_prefill_token_threshold": eng.long_prefill_token_threshold,
                "kv_events": _kv_events(eng.kv_events_config)}})
        except BaseException as e:  # argparse exits with SystemExit
            results.append({"ok": False, "error": _error(e, err)})
    return results


def check_sglang(argvs):
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    results = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(argv)
            if args.speculative_algorithm is not None:
                SpeculativeAlgorithm.from_string(args.speculative_algorithm)  # raises on unknown names
            # --tool-call-parser and --reasoning-parser take only the names SGLang registers (argparse choices
            # from sglang/srt/function_call/parser_names.py and parser/reasoning_parser_names.py, which SGLang's own
            # tests keep equal to its detector registries).
            results.append({"ok": True, "error": "", "values": {
                "enable_hierarchical_cache": args.enable_hierarchical_cache, "hicache_size": args.hicache_size,
                "tool_call_parser": args.tool_call_parser, "reasoning_parser": args.reasoning_parser,
                "trust_remote_code": args.trust_remote_code, "kv_events": _sglang_kv_events(args.kv_events_config)}})
        except BaseException as e:
            results.append({"ok": False, "error": _error(e, err)})
    return results


if __name__ == "__main__":
    req = json.load(sys.stdin)
    res = check_vllm(req["argvs"]) if req["engine"] == "vllm" else check_sglang(req["argvs"])
    sys.stdout.write("\n" + json.dumps(res) + "\n")
