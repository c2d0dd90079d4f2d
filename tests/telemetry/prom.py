"""Reading Prometheus text exposition in tests: sample values by name and labels."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sample's value, 0 when it is absent."""
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)
