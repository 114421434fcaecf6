"""Charts of the course: measured vs estimated time and memory, by subject.

Every chart function builds a ``matplotlib.figure.Figure`` (never pyplot, so nothing is drawn
behind the caller's back) and returns it; the figure shows itself as a PNG when it is the last
expression of a notebook cell, and ``fig.savefig(...)`` writes it anywhere.

Modules: `ladder` (a `compare` table: the ladder, the dashboard, the order of adoption),
`tradeoffs` (the Pareto front, the largest batch under a budget, the race at those
batches), `formats` (lesson 01: number
formats, gradient histograms, GradScaler, loss curves), `memory` (where the bytes are:
breakdowns, saved tensors, growth, timeline, estimates at scale), `checkpointing` (segments,
attention), `claims` (the ledger as a table).
"""
from ..config import MiB
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
)
from .tradeoffs import budget_chart, pareto_chart, race_chart, routes_chart

__all__ = [
    "MiB",
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
    "styled_claims",
    "routes_chart",
]
