"""Models for lesson 05 and ``course-profile``, built from code or configuration, never downloaded:
a Hugging Face causal LM with random weights (`hf_causal_lm`), a residual CNN (`small_cnn`), the
course's GPT (`course_gpt`). Each is a `ZooModel` that `course_utils.profiling.profile` takes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import config_for
from .data import get_batch
from .i18n import tr
from .models import GPT

__all__ = ["ZooModel", "HF_SIZES", "hf_causal_lm", "ResBlock", "SmallCNN", "small_cnn",
           "course_gpt", "require_transformers"]


@dataclass
class ZooModel:
    """A model to profile: ``build()`` -> a fresh ``nn.Module``; ``make_batch(n)`` -> a batch;
    ``loss_fn`` / ``forward`` for `profile` (None: its defaults)."""

    name: str
    build: Callable[[], nn.Module]
    make_batch: Callable[[int], Any]
    loss_fn: Callable | None = None
    forward: Callable | None = None
    describe: str = ""

    def kwargs(self) -> dict:
        """The keyword arguments of `profile` / `extrapolate` this model needs."""
        return {"loss_fn": self.loss_fn, "forward": self.forward, "name": self.name}


def require_transformers():
    """Import ``transformers``, or raise ImportError saying how to install it (the ``hf`` extra)."""
    try:
        import transformers  # lazy: an optional dependency (the hf extra), imported when asked for
    except ImportError as e:
        raise ImportError(tr("Hugging Face models need transformers: pip install -e '.[hf]' "
                             "(or pip install transformers).")) from e
    return transformers


#: Default dimensions of `hf_causal_lm` per size profile: layers, width, heads, sequence.
HF_SIZES = {"smoke": dict(n_layers=2, d_model=64, n_heads=2, seq_len=32),
            "cpu": dict(n_layers=4, d_model=256, n_heads=4, seq_len=128)}


def hf_causal_lm(model_type: str = "gpt2", *, n_layers: int = 2, d_model: int = 64,
                 n_heads: int = 2, seq_len: int = 32, vocab_size: int = 256,
                 dropout: float | None = None, **config_overrides) -> ZooModel:
    """A Hugging Face causal LM (``model_type``: ``gpt2``, ``llama``...) with random weights
    from its configuration class (``AutoConfig.for_model``: nothing downloaded), the dimensions
    set through the configuration's standard names (a Llama-style MLP: ``intermediate_size =
    4 d``, as many key/value heads as heads), ``dropout`` on every dropout probability it has;
    batches of the course's text. ImportError (with the command to install transformers), or
    transformers' ValueError for an unknown model type."""
    transformers = require_transformers()
    kw = dict(num_hidden_layers=n_layers, hidden_size=d_model, num_attention_heads=n_heads,
              max_position_embeddings=seq_len, vocab_size=vocab_size, bos_token_id=0,
              eos_token_id=0, pad_token_id=0)
    cls = transformers.AutoConfig.for_model(model_type).__class__
    probe = cls()
    if hasattr(probe, "intermediate_size"):
        kw.update(intermediate_size=4 * d_model, num_key_value_heads=n_heads)
    if dropout is not None:
        kw.update({k: dropout for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout",
                                        "hidden_dropout") if hasattr(probe, k)})
    kw.update(config_overrides)
    config = cls(**kw)
    config._attn_implementation = "sdpa"

    def build():
        return transformers.AutoModelForCausalLM.from_config(config)

    def make_batch(n: int) -> dict:
        ids, _ = get_batch(n, seq_len)
        return {"input_ids": ids, "labels": ids, "use_cache": False}  # training: no KV cache

    return ZooModel(f"{cls.__name__.removesuffix('Config')}-{n_layers}L-{d_model}d", build,
                    make_batch, describe=tr("{config}({n_layers} layers, d {d_model}, {n_heads} "
                                            "heads, seq {seq_len}, vocab {vocab}), random weights",
                                            config=cls.__name__, n_layers=n_layers,
                                            d_model=d_model, n_heads=n_heads, seq_len=seq_len,
                                            vocab=vocab_size))


class ResBlock(nn.Module):
    """``x + conv(relu(bn(conv(relu(bn(x))))))``: a pre-activation residual block (He et al.
    2016, arXiv 1603.05027), channels and resolution unchanged."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.relu(self.bn1(x)))
        return x + self.conv2(F.relu(self.bn2(h)))


class SmallCNN(nn.Module):
    """Stem conv -> ``blocks`` (an ``nn.Sequential`` of `ResBlock`) -> pooled linear head.
    Input ``(batch, 3, H, W)`` float; output logits ``(batch, n_classes)``."""

    def __init__(self, channels: int = 32, n_blocks: int = 4, n_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*[ResBlock(channels) for _ in range(n_blocks)])
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        return self.head(F.relu(h).mean(dim=(2, 3)))


def small_cnn(channels: int = 32, n_blocks: int = 4, image: int = 32,
              n_classes: int = 10) -> ZooModel:
    """`SmallCNN` on random ``(batch, 3, image, image)`` images with random labels; the batch is
    ``(images, labels)``, the loss cross-entropy."""
    def make_batch(n: int):
        return torch.randn(n, 3, image, image), torch.randint(0, n_classes, (n,))

    return ZooModel(f"SmallCNN-{n_blocks}x{channels}", lambda: SmallCNN(channels, n_blocks, n_classes),
                    make_batch, loss_fn=lambda out, batch: F.cross_entropy(out, batch[1]),
                    forward=lambda model, batch: model(batch[0]),
                    describe=tr("residual CNN, {n_blocks} blocks of {channels} channels, "
                                "{image}x{image} images", n_blocks=n_blocks, channels=channels,
                                image=image))


def course_gpt(size: str | None = None, **overrides) -> ZooModel:
    """The course's GPT at a size profile (`course_utils.config.config_for`), batches of its
    text (``(x, y)``; the model returns ``(logits, loss)``)."""
    cfg = config_for(size, **overrides)
    return ZooModel(f"course GPT ({cfg.n_layers}L-{cfg.d_model}d)", lambda: GPT(cfg.shape),
                    lambda n: get_batch(n, cfg.seq_len),
                    describe=tr("the course's GPT: {n_layers} blocks, d {d_model}, seq {seq_len}",
                                n_layers=cfg.n_layers, d_model=cfg.d_model, seq_len=cfg.seq_len))
