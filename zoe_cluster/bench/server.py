"""What the bench learns about a server before it measures: is it reachable, which model, which engine."""

from __future__ import annotations

import aiohttp

from zoe_cluster.bench.engine_metrics import scrape_cache_counters
from zoe_cluster.bench.report import ServerInfo


class ServerUnreachable(RuntimeError):
    """The URL does not answer like an OpenAI-compatible server; the message says why."""


async def probe_server(session: aiohttp.ClientSession, base_url: str, model: str | None) -> ServerInfo:
    """Check `base_url` answers `/v1/models`, pick the model (the first served one when `model` is None, else
    check it is served), and note the engine (from /metrics), version (from /version) and, for zoe's simulated
    engine, its /sim/info (model, variant, time scale) when available."""
    base = base_url.rstrip("/")
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=15)) as resp:
            if resp.status != 200:
                raise ServerUnreachable(f"{base}/v1/models answered HTTP {resp.status}: {(await resp.text())[:200]}")
            # content_type=None: sglang-router answers /v1/models as text/plain.
            served = [m.get("id") for m in (await resp.json(content_type=None)).get("data", [])]
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ServerUnreachable(f"cannot reach {base}: {type(exc).__name__}: {exc}") from None
    except ValueError:
        raise ServerUnreachable(f"{base}/v1/models did not answer JSON") from None
    if model is None:
        if not served:
            raise ServerUnreachable(f"{base} serves no model; pass --model")
        model = served[0]
    elif served and model not in served:
        raise ServerUnreachable(f"{base} does not serve model {model!r}; it serves: {', '.join(map(str, served))}")
    version = None
    try:
        async with session.get(base + "/version", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                data = await resp.json(content_type=None)
                version = str(data.get("version", data)) if isinstance(data, dict) else str(data)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    sim = None
    try:
        async with session.get(base + "/sim/info", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                data = await resp.json(content_type=None)
                sim = {k: data.get(k) for k in ("model", "variant", "time_scale", "block_tokens", "seed")}
                version = version or f"zoe-sim {data.get('model')}/{data.get('variant')}"
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        pass
    counters = await scrape_cache_counters(session, base)
    return ServerInfo(url=base, model=model, engine=counters.engine, version=version, sim=sim)
