"""MetricSpec: how one exported metric family is declared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric family: its full name, type, help text and label names.

    A counter's ``name`` ends in ``_total``; its family name is ``name``
    without that suffix (as prometheus_client names counter families).
    ``total``, on a per-connection family, names the broker-wide family that
    sums it over every connection (its labels without ``connection``).
    """

    name: str
    type: Literal["gauge", "counter", "histogram"]
    documentation: str
    labels: tuple[str, ...] = ()
    total: str = ""

    def family(self) -> GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily:
        """A new, empty metric family for this spec."""
        if self.type == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        if self.type == "histogram":
            return HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
