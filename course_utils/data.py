"""Real English text for the byte-level model: ``pydoc_data.topics.topics`` of the running
CPython (the text behind ``help()``, about 460 KB), so the course needs no download. Bytes are
tokens: the vocabulary is 256.
"""
from __future__ import annotations

import functools
import itertools
import zlib

import torch

from .i18n import tr

__all__ = ["corpus_bytes", "corpus_tensor", "get_batch", "batches"]

VAL_FRACTION = 0.1


@functools.lru_cache(maxsize=1)
def corpus_bytes() -> bytes:
    """The corpus as UTF-8 bytes, the topics in key order.

    Raises:
        RuntimeError: this Python ships without ``pydoc_data`` (some minimal distributions).
    """
    try:
        from pydoc_data.topics import topics  # lazy: 460 KB of text
    except ImportError as e:  # pragma: no cover - every CPython ships it
        raise RuntimeError(tr("this Python has no pydoc_data.topics; the course's text corpus "
                              "comes from it (install a full CPython).")) from e
    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


@functools.lru_cache(maxsize=2)
def corpus_tensor(split: str = "train") -> torch.Tensor:
    """The corpus as an int64 tensor of bytes, ``split`` ``"train"`` (first 90%) or ``"val"``.

    Raises:
        ValueError: an unknown split.
    """
    data = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).long()
    n = int(len(data) * (1 - VAL_FRACTION))
    if split == "train":
        return data[:n]
    if split == "val":
        return data[n:]
    raise ValueError(tr("unknown split {split!r}: expected 'train' or 'val'.", split=split))


def get_batch(batch_size: int, seq_len: int, split: str = "train", seed: int = 0,
              step: int = 0, device: str | torch.device = "cpu"):
    """``(x, y)``, int64 ``(batch_size, seq_len)``, ``y`` the next byte of each of ``x``'s:
    deterministic in (seed, step, split).

    Raises:
        ValueError: non-positive sizes, or ``seq_len`` longer than the split allows.
    """
    if batch_size < 1 or seq_len < 1:
        raise ValueError(tr("batch_size and seq_len must be >= 1, got {batch_size} and "
                            "{seq_len}.", batch_size=batch_size, seq_len=seq_len))
    data = corpus_tensor(split)
    if seq_len + 1 >= len(data):
        raise ValueError(tr("seq_len {seq_len} is too long for the {split} split ({n} bytes).",
                            seq_len=seq_len, split=split, n=len(data)))
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{step}:{split}".encode()))
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=g)
    x = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts.tolist()])
    return x.to(device), y.to(device)


def batches(config, split: str = "train", start_step: int = 0):
    """Endless micro-batches ``(x, y)`` for a `RunConfig` (its batch, seq, seed and device)."""
    for step in itertools.count(start_step):
        yield get_batch(config.batch_size, config.seq_len, split, config.seed, step, config.device)
