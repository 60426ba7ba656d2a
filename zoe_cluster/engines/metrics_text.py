"""Reading Prometheus text exposition into sums by metric name: the one parser every adapter uses."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from zoe_cluster.engines.base import EngineStats


def sum_samples(text: str, names: set[str]) -> dict[str, float]:
    """Sum every sample of each wanted metric name over all label sets.

    `names` are sample names as exposed (e.g. ``vllm:prefix_cache_hits_total``); a missing one reads 0.
    """
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name] += sample.value
    return out


def labelled_values(text: str, name: str, label: str) -> dict[str, float]:
    """Values of metric `name` keyed by one label's value (e.g. zoe_kernel_active by kernel)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and label in sample.labels:
                out[sample.labels[label]] = out.get(sample.labels[label], 0.0) + sample.value
    return out


def engine_stats(text: str, scraped_at: float, names: dict[str, str]) -> EngineStats:
    """`EngineStats` from an engine's /metrics, given which sample name feeds each field (summed over labels),
    plus the kernels the zoe plugin reports active (`zoe_kernel_active{kernel=...}`)."""
    sums = sum_samples(text, set(names.values()))
    active = labelled_values(text, "zoe_kernel_active", "kernel")
    return EngineStats(
        scraped_at=scraped_at,
        **{field: sums[name] for field, name in names.items()},
        zoe_kernels_active=tuple(sorted(k for k, on in active.items() if on > 0)),
    )
