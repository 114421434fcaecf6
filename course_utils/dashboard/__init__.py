"""The live dashboard of lesson 03 (``from course_utils.dashboard import dashboard``): pick a
precision, a checkpoint policy and a size, press Run, read the comparison with the baseline.

The package is the dashboard's one room:

* `course_utils.dashboard.widget`: the `Dashboard` itself (controls, Run and Stop, progress,
  history, chart) and where a Run happens (a worker thread, or the kernel's thread on Colab);
* `course_utils.dashboard.run`: what a Run runs (the configuration and its baseline), how long
  it will take (`run.StepClock`, `run.plan_run`) and the step hook behind progress and Stop;
* `course_utils.dashboard.report`: what a Run reports (the message, the history table, the
  header, out-of-memory suggestions), in the words of the course's tables.

A Run measures through `course_utils.experiments.compare` and draws with
`course_utils.plots.dashboard_chart`, like every lesson.
"""
from .report import history_table, oom_suggestions
from .widget import MODE_ENV, SLOW_LIMIT_S, Dashboard, background_updates_render, dashboard, policy_options

__all__ = ["SLOW_LIMIT_S", "MODE_ENV", "Dashboard", "background_updates_render", "dashboard",
           "history_table", "oom_suggestions", "policy_options"]
