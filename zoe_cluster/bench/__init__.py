"""`zoe bench`: measure any OpenAI-compatible deployment the way the seed measured its engine.

Workloads (`prefill` with prefix-cache hit-rate control, `decode` concurrency sweep, `trace` replay) drive a
streaming client (`client`), read the engine's /metrics before and after (`engine_metrics`), and write a
`BenchReport` (`report`) that `plots` draws and `compare` sets side by side.
"""
