"""Charts of the course: measured vs estimated time and memory, by subject.

Every chart function returns a ``matplotlib.figure.Figure`` made without pyplot that shows itself
as a PNG when it is a notebook cell's last expression (`._style.ChartFigure`). Every chart takes
a ``title`` and, where its data was measured at a size, ``size``: the size profile, appended to
the title as "size '...'". MiB = 2^20 bytes, GiB = 2^30 bytes throughout.

Modules: `ladder` (a `compare` table, the dashboard, the order of adoption), `tradeoffs` (the
Pareto front, the budget search, the race, fine-tuning routes), `formats` (lesson 01), `memory`
(where the bytes are), `checkpointing` (segments, attention), `claims` (the ledger as a table).
"""
from .checkpointing import attention_memory_chart, segments_chart
from .claims import styled_claims
from .formats import format_range_chart, log2_histogram_chart, loss_curves_chart, scaler_trace_chart
from .ladder import adoption_chart, comparison_chart, dashboard_chart
from .memory import (
                     memory_breakdown_chart,
                     memory_growth_chart,
                     memory_timeline_chart,
                     saved_tensors_chart,
                     scale_chart,
                     sharding_chart,
)
from .tradeoffs import budget_chart, pareto_chart, race_chart, routes_chart

__all__ = [
    "adoption_chart",
    "attention_memory_chart",
    "budget_chart",
    "comparison_chart",
    "dashboard_chart",
    "format_range_chart",
    "log2_histogram_chart",
    "loss_curves_chart",
    "memory_breakdown_chart",
    "memory_growth_chart",
    "memory_timeline_chart",
    "pareto_chart",
    "race_chart",
    "saved_tensors_chart",
    "scale_chart",
    "scaler_trace_chart",
    "segments_chart",
    "sharding_chart",
    "styled_claims",
    "routes_chart",
]
