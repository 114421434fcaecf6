"""course_utils: the code of the course "Mixed precision and activation checkpointing in
PyTorch, measured on your machine". The lessons import what they teach from here.

The data flow::

    hardware.detect -> recommend_precision -> config_for (size profile)      hardware, config
    RunConfig (ModelShape, batch, precision, checkpoint policy, ...)
      -> build_model; apply_checkpointing wraps blocks                       models, checkpointing
      -> train_step: autocast, GradScaler(enabled=fp16), unscale_, clip      training
      -> measure -> Measurement            estimate -> MemoryEstimate        measure, memory_model
      -> compare / ladder -> table (noise-aware times)                       experiments, step_timing
      -> verdict per claim                                                   claims
      -> plots, dashboard, cli (course-bench)
    any nn.Module -> profile (blocks found, wrapped per policy) -> Profile    profiling, offload
      -> extrapolate (peak at any batch) -> recommendation card          extrapolate, card
      -> cli_profile (course-profile)

Submodules not imported here (import them by name): ``plots`` (matplotlib), ``dashboard``
(ipywidgets), ``formats``, ``fp32_matmul``, ``autocast_ops``, ``gradients``, ``loss_scaling``,
``nonfinite``, ``training_arms`` (lesson 01's tools), ``memory_timeline``, ``learner_checks``
(the exercises' checks), ``evidence``, ``lora``, ``distributed``, ``search`` (largest batch under a budget),
``results``, ``quiz``, ``cli``, ``extrapolate``, ``card``, ``model_zoo`` (lesson 05's models),
``offload``, ``cli_profile``, ``chunked_loss`` (the chunked cross-entropy that
``RunConfig.loss_chunk`` turns on). The words every module shares (precision names, units) are in
``terms``; the layers are in CONTRIBUTING.md.
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
