"""Charts of the course: measured vs estimated time and memory (matplotlib), by subject.

Every chart function returns a ``matplotlib.figure.Figure`` and draws only what it is given.

Modules: `ladder` (a `compare` table: the ladder, the dashboard, the order of adoption, the
Pareto front, the budget search), `formats` (lesson 01: number formats, gradient histograms,
GradScaler, loss curves), `memory` (where the bytes are: breakdowns, saved tensors, growth,
timeline, estimates at scale), `checkpointing` (segments, attention), `claims` (the ledger).
"""
from ..config import MiB
from .checkpointing import attention_memory_chart, segments_chart
from .claims import styled_claims
from .formats import format_range_chart, log2_histogram_chart, loss_curves_chart, scaler_trace_chart
from .ladder import adoption_chart, budget_chart, comparison_chart, dashboard_chart, pareto_chart
from .memory import (
                     memory_breakdown_chart,
                     memory_growth_chart,
                     memory_timeline_chart,
                     saved_tensors_chart,
                     scale_chart,
)

__all__ = [
    # ladder: compare tables
    "comparison_chart", "dashboard_chart", "adoption_chart", "pareto_chart", "budget_chart",
    # formats: lesson 01
    "format_range_chart", "log2_histogram_chart", "scaler_trace_chart", "loss_curves_chart",
    # memory
    "memory_breakdown_chart", "saved_tensors_chart", "memory_growth_chart",
    "memory_timeline_chart", "scale_chart",
    # checkpointing: lesson 02
    "segments_chart", "attention_memory_chart",
    # claims
    "styled_claims",
    # the unit the charts use (defined in course_utils.config)
    "MiB",
]
