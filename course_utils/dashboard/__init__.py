"""The live dashboard of lesson 03 (``from course_utils.dashboard import dashboard``): pick a
precision, a checkpoint policy and a size, press Run, read the comparison with the baseline.

Modules: `widget` (the `Dashboard`: controls, Run and Stop, where a Run happens), `run` (what a Run
runs, how long it will take, the step hook behind progress and Stop), `report` (what a Run
reports). A Run measures through `course_utils.experiments.compare` and draws with
`course_utils.plots.dashboard_chart`, like every lesson.
"""
from .report import history_table, oom_suggestions
from .widget import MODE_ENV, SLOW_LIMIT_S, Dashboard, background_updates_render, dashboard, policy_options

__all__ = ["SLOW_LIMIT_S", "MODE_ENV", "Dashboard", "background_updates_render", "dashboard",
           "history_table", "oom_suggestions", "policy_options"]
