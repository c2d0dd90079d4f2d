"""Reading Prometheus text exposition in tests: sample values by name and labels. Every pegainfer
sample carries `model_name`; `value` matches on the labels it is given, and on model_name only when
that is one of them."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

MODEL = "model_name"


def families(text: str) -> dict[str, object]:
    """Family name -> the parsed family (type, samples)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sample's value, 0 when it is absent."""
    want = sorted(labels.items())
    for (n, got), v in samples(text).items():
        if n == name and [kv for kv in got if kv[0] != MODEL or MODEL in labels] == want:
            return v
    return 0.0


def total(text: str, name: str, **labels: str) -> float:
    """The sum over every sample of `name` whose labels include `labels`."""
    return sum(v for (n, got), v in samples(text).items() if n == name and set(labels.items()) <= set(got))
