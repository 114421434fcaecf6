"""A bigger GPU standing in for a smaller one: ``COURSE_STAND_IN=t4`` makes the course plan on any
CUDA GPU as on a Colab T4: its compute capability (7.5, NVIDIA's T4 datasheet), size profile and
memory, enforced by the caching allocator (``torch.cuda.set_per_process_memory_fraction``); not
its speed nor its kernels (`describe` says so). The memory CUDA reports on a T4, 14.75 GiB:
``deviceMemorySize`` in a Tesla T4's TensorFlow log, NVIDIA/DALI issue 1813.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .i18n import tr
from .terms import GiB

__all__ = ["STAND_IN_ENV", "StandIn", "STAND_INS", "active", "describe", "apply_memory_cap",
           "cap_bytes", "free_bytes", "memory_text"]

STAND_IN_ENV = "COURSE_STAND_IN"


@dataclass(frozen=True)
class StandIn:
    """The card a bigger GPU stands in for: ``key`` is the value of ``$COURSE_STAND_IN`` and the
    size profile; ``name`` as CUDA reports it; ``memory_bytes`` as CUDA reports it, the cap."""

    key: str
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int


STAND_INS = {"t4": StandIn("t4", "Tesla T4", (7, 5), int(14.75 * GiB))}


def active() -> StandIn | None:
    """The card named by ``$COURSE_STAND_IN``, or None when it is unset or empty; ValueError
    (listing the cards) for a value that names none."""
    key = os.environ.get(STAND_IN_ENV, "").strip().lower()
    if not key:
        return None
    if key not in STAND_INS:
        raise ValueError(tr("{env}={key!r} names no card the course can stand in for: expected "
                            "one of {cards} (or unset).", env=STAND_IN_ENV, key=key,
                            cards=", ".join(STAND_INS)))
    return STAND_INS[key]


def describe(real_name: str, card: StandIn) -> str:
    """The words every header that plans from a stand-in prints, e.g. ``"NVIDIA H200 standing
    in for a Tesla T4: its recipe, sizes and memory (14.75 GiB); not its speed"``."""
    return tr("{real} standing in for a {card}: its recipe, sizes and memory ({memory:.2f} GiB); "
              "not its speed", real=real_name, card=card.name, memory=card.memory_bytes / GiB)


def cap_bytes(index: int) -> int | None:
    """What the caching allocator of CUDA device ``index`` may reserve under the stand-in
    (bytes), or None with no stand-in active."""
    card = active()
    if card is None:
        return None
    total = torch.cuda.get_device_properties(index).total_memory
    return min(card.memory_bytes, int(total))


def memory_text(index: int) -> str:
    """The memory of CUDA device ``index`` as the course plans with it, in words: its total
    (``"139.8 GiB"``), or under a stand-in the card's (``"the 14.75 GiB of the Tesla T4..."``)."""
    card, cap = active(), cap_bytes(index)
    if card is None or cap is None:
        return f"{torch.cuda.get_device_properties(index).total_memory / GiB:.1f} GiB"
    return tr("the {size} of the {card} this GPU stands in for", size=f"{cap / GiB:.2f} GiB",
              card=card.name)


def apply_memory_cap(index: int) -> None:
    """Limit CUDA device ``index``'s caching allocator to the stand-in's memory (no-op without a
    stand-in)."""
    cap = cap_bytes(index)
    if cap is not None:
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), index)


def free_bytes(index: int) -> int:
    """Bytes this process may still have the allocator reserve on CUDA device ``index``: the
    driver's free memory, and under a stand-in at most its memory less what this process has
    reserved (the cap counts reserved bytes, not allocated ones)."""
    free = int(torch.cuda.mem_get_info(index)[0])
    cap = cap_bytes(index)
    if cap is None:
        return free
    return max(0, min(free, cap - int(torch.cuda.memory_reserved(index))))
