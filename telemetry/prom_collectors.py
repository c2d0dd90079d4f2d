"""The custom Prometheus collectors behind /metrics, written only against prometheus_client's public
collector API (Collector, Metric, the *MetricFamily classes):

- `WithModelName` puts the served model's name (`model_name`, the label vLLM puts on every series)
  on every sample of an inner registry, at scrape time, so that no series can miss it;
- `BatchedHistogram` takes n equal observations at once (an engine step gives every request in its
  batch the same inter-token latency): one bucket update per distinct value, not one per request;
- `Tally` renders counters whose values are plain ints the event loop keeps (token totals,
  rejections by stage and code), so that /metrics, /ready and the stats log line read one number;
- `DroppedSpans` renders the span processors' drop counts, refreshed before each scrape."""
from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

MODEL_LABEL = "model_name"


class WithModelName(Collector):
    """Every family of `inner`, each sample labelled model_name=<name()>: the label is added here,
    once, rather than to every metric's definition."""

    def __init__(self, inner: CollectorRegistry, name: Callable[[], str]) -> None:
        self.inner = inner
        self.name = name

    def collect(self) -> Iterator[Metric]:
        model = self.name()
        for family in self.inner.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                out.add_sample(s.name, {MODEL_LABEL: model, **s.labels}, s.value, s.timestamp, s.exemplar)
            yield out


class BatchedHistogram(Collector):
    """A histogram (rendered as prometheus_client's Histogram renders one, less `_created`) that
    takes `n` equal observations in one call."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = [float(b) for b in buckets]
        if self.bounds != sorted(set(self.bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing")
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe_n(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n  # the first bound >= value
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, buckets = 0, []
        for bound, n in zip([*self.bounds, float("inf")], self.counts):
            cumulative += n
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


class Tally(Collector):
    """A counter family whose values live in `values` (label values -> count), kept by the caller;
    label sets listed in `always` are rendered at 0 before they are first counted."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = (),
                 always: Sequence[tuple[str, ...]] = ()) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.values: Counter[tuple[str, ...]] = Counter({key: 0 for key in always} if labels else {(): 0})

    def inc(self, *label_values: str, n: int = 1) -> None:
        self.values[label_values] += n

    def total(self, **where: str) -> int:
        """The sum over the label sets that match `where` (all of them when it is empty)."""
        index = {name: i for i, name in enumerate(self.labels)}
        return sum(v for key, v in self.values.items() if all(key[index[k]] == want for k, want in where.items()))

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in sorted(self.values.items()):
            family.add_metric(list(key), value)
        yield family


class DroppedSpans(Collector):
    """A counter whose value lives in the span processors: refreshed just before each scrape."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.by_exporter: dict[str, int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, "Spans dropped because an exporter's queue was full",
                                     labels=["exporter"])
        for exporter, value in sorted(self.by_exporter.items()):
            family.add_metric([exporter], value)
        yield family
