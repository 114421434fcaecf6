"""course_utils: the code of the course "Mixed precision and activation checkpointing in
PyTorch, measured on your machine". The lessons import what they teach from here.

Exported here: a run's configuration (`config_for`), model (`build_model`), step (`train_step`),
measurements (`measure`, `compare`, `ladder`) and claim verdicts (`verdict`). Every other module
(``plots``, ``dashboard``, ``quiz``, ``learner_checks``, ``cli``, ...) is imported by name; the
words every module shares (precision names, units) are in ``terms``; the layers are in
CONTRIBUTING.md.
"""
from .checkpointing import MODES, apply_checkpointing, segment_bounds
from .claims import CLAIMS, Verdict, claims_table, verdict
from .config import ModelShape, RunConfig, config_for, size_profile
from .data import get_batch
from .experiments import compare, ladder, summary
from .guard import check_feasible
from .hardware import detect, is_emulated, recommend_precision, report, use_threads
from .measure import Measurement, measure
from .memory_model import MemoryEstimate, estimate, parameter_count
from .models import GPT, build_model
from .profiling import Profile, find_blocks, profile, wrap_blocks
from .saved_tensors import measure_saved, saved_by_module, saved_bytes
from .step_timing import TimeRatio, time_ratio
from .terms import GiB, MiB
from .training import setup, train, train_step

__all__ = ["MODES", "apply_checkpointing", "segment_bounds", "CLAIMS", "Verdict",
           "claims_table", "verdict", "GiB", "MiB", "ModelShape", "RunConfig", "config_for",
           "size_profile", "get_batch", "compare", "ladder", "summary", "check_feasible",
           "detect", "is_emulated", "recommend_precision", "report", "use_threads",
           "Measurement", "measure", "measure_saved", "saved_bytes", "saved_by_module",
           "MemoryEstimate", "estimate", "parameter_count", "GPT", "build_model", "TimeRatio",
           "time_ratio", "setup", "train", "train_step", "Profile", "find_blocks", "profile",
           "wrap_blocks"]
