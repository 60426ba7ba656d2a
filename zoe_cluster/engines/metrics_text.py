"""Reading Prometheus text exposition into sums by metric name: the one parser every adapter uses."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


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
