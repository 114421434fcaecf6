"""Does a precision hurt training? Short runs of the course's model, one per *arm* (lesson 01 §8).
Every arm runs `course_utils.training.train_step`: "fp16 without a scaler" with
``GradScaler(enabled=False)``; a ``loss_factor`` multiplies the loss before ``backward``. A power
of two moves every gradient by exactly that factor, sliding the histogram toward fp16's underflow:
it stands in for the smaller gradients of deeper networks, which a model small enough to train in
seconds does not have. The **flushed share** is the share of the matmul weights' gradient entries
(embeddings excluded: their rows for absent bytes are 0 in any precision) that are exactly 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm.auto import tqdm

from .config import RunConfig
from .guard import check_feasible
from .i18n import tr
from .terms import autocast_dtype, check_positive_int
from .training import StepCounter, TrainHistory, evaluate, setup, train_step

__all__ = ["HARM", "Arm", "ArmHistory", "feasible_arms", "flushed_trend", "relative_gap",
           "results_table", "shows_harm", "train_arm", "train_arms"]

#: A final validation loss more than this fraction above the reference's is harm (claim C13's
#: threshold in `course_utils.claims`).
HARM = 0.02


@dataclass(frozen=True)
class Arm:
    """One run of an accuracy comparison: ``label``, ``precision``, ``scaler`` (GradScaler on, for
    fp16 only) and the ``loss_factor`` applied before ``backward``.

    Raises:
        ValueError: an unknown precision or a loss factor that is not a positive number.
    """

    label: str
    precision: str
    scaler: bool = True
    loss_factor: float = 1.0

    def __post_init__(self):
        autocast_dtype(self.precision)
        if not (isinstance(self.loss_factor, (int, float)) and self.loss_factor > 0):
            raise ValueError(tr("loss_factor must be a positive number, got {factor!r}.",
                                factor=self.loss_factor))


@dataclass
class ArmHistory(TrainHistory):
    """A `TrainHistory` (of the plain loss) plus the ``flushed`` share per step (0 to 1), the
    ``arm`` and its wall time in ``seconds``."""

    flushed: list = field(default_factory=list)
    arm: Arm | None = None
    seconds: float = 0.0


class _ScaledLoss:
    """What `train_step` calls as its model: the model, with the loss multiplied by ``factor``."""

    def __init__(self, model, factor: float):
        self.model, self.factor = model, factor

    def __call__(self, x, y):
        logits, loss = self.model(x, y)
        return logits, loss * self.factor

    def parameters(self):
        return self.model.parameters()


def train_arm(config: RunConfig, arm: Arm, steps: int, eval_every: int, eval_batches: int = 2,
              progress=None) -> ArmHistory:
    """Train ``config``'s model in the arm's precision, scaler and loss factor for ``steps``
    steps of `train_step`; validation loss at step 0, every ``eval_every`` steps and at the end.
    ``progress``: a tqdm bar to advance per step, or None.

    Raises:
        ValueError: a count < 1.
    """
    for name, v in (("steps", steps), ("eval_every", eval_every), ("eval_batches", eval_batches)):
        check_positive_int(name, v)
    cfg = config.replace(precision=arm.precision)
    t0 = time.perf_counter()
    state = setup(cfg)
    scaler = torch.amp.GradScaler(cfg.device_type, enabled=arm.precision == "fp16" and arm.scaler)
    model = state.model if arm.loss_factor == 1 else _ScaledLoss(state.model, arm.loss_factor)
    counts = [0, 0]

    def count(p):
        counts[0] += int((p.grad == 0).sum())
        counts[1] += p.grad.numel()

    handles = [p.register_post_accumulate_grad_hook(count) for name, p in state.module.named_parameters()
               if p.dim() == 2 and "emb" not in name and p.requires_grad]   # the matmul weights
    steps_taken = StepCounter(state.optimizer)
    hist = ArmHistory(cfg, arm=arm)
    hist.val_steps.append(0)
    hist.val_loss.append(evaluate(state, eval_batches))
    try:
        for i in range(1, steps + 1):
            counts[:] = [0, 0]
            taken = steps_taken.taken
            loss = train_step(model, state.optimizer, scaler, state.next_micro_batches(),
                              cfg.dtype, state.max_grad_norm)
            hist.steps.append(i)
            hist.train_loss.append(loss.float().item() / arm.loss_factor)
            hist.flushed.append(counts[0] / counts[1] if counts[1] else 0.0)
            if scaler.is_enabled():
                hist.scales.append(scaler.get_scale())
            if steps_taken.taken == taken:
                hist.skipped.append(i)
            if i % eval_every == 0 or i == steps:
                hist.val_steps.append(i)
                hist.val_loss.append(evaluate(state, eval_batches))
            if progress is not None:
                progress.update(1)
    finally:
        for h in handles:
            h.remove()
        steps_taken.remove()
    hist.seconds = time.perf_counter() - t0
    return hist


def feasible_arms(config: RunConfig, arms, hw=None) -> tuple[list[Arm], list[tuple[Arm, str]]]:
    """``(accepted arms, [(refused arm, reason), ...])``: ``arms`` split by whether
    `course_utils.guard.check_feasible` accepts them for ``config`` on ``hw`` (default:
    detected), so a lesson trains the first and prints the second."""
    accepted, refused = [], []
    for a in arms:
        try:
            check_feasible(config.replace(precision=a.precision), hw)
        except ValueError as e:
            refused.append((a, str(e)))
        else:
            accepted.append(a)
    return accepted, refused


def train_arms(config: RunConfig, arms, steps: int, eval_every: int | None = None,
               eval_batches: int = 2, progress: bool = True,
               force: bool = False) -> dict[str, ArmHistory]:
    """``{arm.label: ArmHistory}``: `train_arm` for each arm in turn, from the same seed, data
    and AdamW settings, under one tqdm bar; ``eval_every`` defaults to a fifth of ``steps``.

    Raises:
        ValueError: before anything runs: no arms, repeated labels, bad counts, or an arm
            `course_utils.guard.check_feasible` refuses, unless ``force``.
    """
    arms = list(arms)
    if not arms:
        raise ValueError(tr("train_arms needs at least one Arm."))
    labels = [a.label for a in arms]
    if len(set(labels)) != len(labels):
        raise ValueError(tr("arm labels must differ, got {labels}.", labels=labels))
    for a in arms:
        check_feasible(config.replace(precision=a.precision), force=force)
    eval_every = eval_every or max(1, steps // 5)
    bar = tqdm(total=len(arms) * steps, desc=tr("training"), disable=not progress, leave=False)
    try:
        return {a.label: train_arm(config, a, steps, eval_every, eval_batches, bar) for a in arms}
    finally:
        bar.close()


def relative_gap(histories: dict, label: str, reference: str) -> float:
    """(final validation loss of ``label`` - the reference's) / the reference's."""
    ref = histories[reference].val_loss[-1]
    return (histories[label].val_loss[-1] - ref) / ref


def shows_harm(histories: dict, label: str, reference: str) -> bool:
    """Whether ``label`` ended more than `HARM` (relative) above ``reference``'s validation loss."""
    return relative_gap(histories, label, reference) > HARM


def _pct(x: float) -> str:
    """A share (0 to 1) as a percentage with two significant figures."""
    if x == 0:
        return "0%"
    return f"{100 * x:.2g}%" if 100 * x >= 1e-3 else tr("under 0.001%")


def flushed_trend(history: ArmHistory) -> str:
    """How the flushed share of ``history`` moved, in words: the mean of the first fifth of the
    steps against the last fifth's, and a peak well above both (``"rose from 0.1% (mean of
    steps 1-4) to 2.7% (mean of steps 17-20)"``).

    Raises:
        ValueError: a history without flushed shares.
    """
    f = list(history.flushed)
    if not f:
        raise ValueError("flushed_trend needs a history with a flushed share per step.")
    n = len(f)
    k = max(1, n // 5)
    first, last = sum(f[:k]) / k, sum(f[-k:]) / k
    steps = history.steps if len(history.steps) == n else list(range(1, n + 1))

    def when(a: int, b: int) -> str:  # the steps a share is the mean of
        return (tr("step {step}", step=steps[a]) if k == 1 else
                tr("mean of steps {first}-{last}", first=steps[a], last=steps[b]))

    shares = {"first": _pct(first), "head": when(0, k - 1), "last": _pct(last),
              "tail": when(-k, -1)}
    top = max(range(n), key=lambda i: f[i])
    if f[top] == 0:
        return tr("stayed at 0% at every one of the {n} steps", n=n)
    if 0 < top < n - 1 and f[top] > 1.5 * max(first, last):
        return tr("rose to {peak} at step {step} and fell back: {first} ({head}), {last} ({tail})",
                  peak=_pct(f[top]), step=steps[top], **shares)
    if last > 1.25 * first:
        return tr("rose from {first} ({head}) to {last} ({tail})", **shares)
    if first > 1.25 * last:
        return tr("fell from {first} ({head}) to {last} ({tail})", **shares)
    return tr("stayed about level: {first} ({head}), {last} ({tail})", **shares)


def results_table(histories: dict, reference: str) -> pd.DataFrame:
    """One row per arm: final validation loss, its gap to ``reference`` (%, to 0.01), the
    flushed share (mean and last step, %) and the skipped steps. No time: an arm's wall time
    includes building the model and validating.

    Raises:
        ValueError: ``reference`` is not one of the arms.
    """
    if reference not in histories:
        raise ValueError(tr("reference {reference!r} is not one of {labels}.",
                            reference=reference, labels=list(histories)))
    rows = {label: {
        "final val loss": h.val_loss[-1],
        # + 0.0 turns -0.0 into 0.0
        f"vs {reference} %": round(100 * relative_gap(histories, label, reference), 2) + 0.0,
        "flushed % (mean)": 100 * sum(h.flushed) / max(1, len(h.flushed)),
        "flushed % (last step)": 100 * (h.flushed[-1] if h.flushed else 0.0),
        "skipped steps": len(h.skipped),
    } for label, h in histories.items()}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("run")
