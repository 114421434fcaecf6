"""course_utils.profiling: profile() and its parts (blocks found and wrapped, per-policy
measurements, timing, bad inputs) on the course's GPT, a Hugging Face GPT-2 and a Llama-style
model built from their configuration classes (nothing downloaded), and a plain CNN. Offloading,
the extrapolation, the card and course-profile have their own files.

Saved bytes are compared with the course's meter run independently of the profile (a plain
forward, the course's own `measure`, HF's own checkpointing), and gradients with and without
each policy. Every model is tiny: the whole module takes seconds.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import zoo

from course_utils.config import config_for
from course_utils.extrapolate import block_input_bytes
from course_utils.measure import measure
from course_utils.profiling import (
    CheckpointedBlock,
    ModelDoesNotFit,
    ModelSpec,
    NoRepeatedBlocks,
    find_blocks,
    profile,
    wrap_blocks,
)
from course_utils.saved_tensors import SavedTensorMeter

POLICIES = ("none", "full", "every-2", "selective", "offload", "offload+checkpoint")


BLOCKS = {"gpt": ("layers", "Block"), "gpt2": ("transformer.h", "GPT2Block"),
          "llama": ("model.layers", "LlamaDecoderLayer"), "cnn": ("blocks", "ResBlock")}


@pytest.fixture(scope="module")
def profiles():
    """One memory-only profile per model, every policy (HF's own for the HF models)."""
    out = {}
    for kind in BLOCKS:
        z = zoo(kind)
        pols = POLICIES + (("hf",) if kind in ("gpt2", "llama") else ())
        out[kind] = (z, profile(z.build, z.make_batch, batch_size=2, policies=pols, timed=False,
                                progress=False, **z.kwargs()))
    return out


# --- blocks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(BLOCKS))
def test_blocks_are_found_in_every_model(kind):
    z = zoo(kind)
    path, container = find_blocks(z.build())
    assert (path, type(container[0]).__name__) == BLOCKS[kind]
    assert find_blocks(z.build(), path)[0] == path  # named


def test_no_repeated_blocks_is_a_clear_error():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(NoRepeatedBlocks, match="no repeated blocks found.*blocks='path"):
        find_blocks(mlp)
    with pytest.raises(NoRepeatedBlocks, match="no submodule 'layers'"):
        find_blocks(mlp, "layers")
    with pytest.raises(NoRepeatedBlocks):
        profile(mlp, lambda n: torch.randn(n, 4), batch_size=2, progress=False)


def test_wrapping_keeps_parameters_and_refuses_twice():
    z = zoo("gpt")
    model = z.build()
    before = {id(p) for p in model.parameters()}
    wrap_blocks(model, "full")
    assert {id(p) for p in model.parameters()} == before
    assert all(isinstance(b, CheckpointedBlock) for b in model.layers)
    with pytest.raises(ValueError, match="wrapped already"):
        wrap_blocks(model, "offload")
    with pytest.raises(ValueError, match="valid policies are"):
        wrap_blocks(z.build(), "every-9")


# --- saved bytes against the meter, gradients against no checkpointing --------------------------

def _plain_saved(z) -> int:
    """Saved bytes of one plain forward + loss, the meter run by hand (no profile machinery)."""
    spec = ModelSpec.create(z.build, z.make_batch, z.loss_fn, forward=z.forward, device="cpu")
    model, batch = spec.fresh("none"), spec.batch(2)
    with SavedTensorMeter(model) as meter:
        loss = spec.loss_fn(spec.forward(model, batch), batch)
    del loss
    return sum(meter.totals().values())


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_saved_bytes_agree_with_the_meter(profiles, kind):
    z, prof = profiles[kind]
    none = prof.get("fp32", "none")
    assert none.saved_total == _plain_saved(z)
    # a checkpointed block keeps its input only: the bytes of block 0's first argument
    spec = ModelSpec.create(z.build, z.make_batch, z.loss_fn, forward=z.forward, device="cpu")
    block_in = block_input_bytes(spec, 2)
    full = prof.saved_by_block("fp32", "full")
    blocks = [w for w in full.index if w.startswith("block")]
    assert len(blocks) == prof.n_blocks
    assert all(full.loc[w, "bytes"] == block_in for w in blocks)
    outside = prof.saved_by_block("fp32", "none").loc["outside the blocks", "bytes"]
    assert full.loc["outside the blocks", "bytes"] == outside
    # every-2 checkpoints block 0 of 2: block 0 keeps its input, block 1 all it saves
    plain = prof.saved_by_block("fp32", "none")
    every = prof.saved_by_block("fp32", "every-2")
    assert every.loc["block 0", "bytes"] == block_in
    if kind == "llama":  # rotary cos/sin are shared by the blocks: counted where first saved
        assert every.loc["block 1", "bytes"] > plain.loc["block 1", "bytes"]
    else:
        assert every.loc["block 1", "bytes"] == plain.loc["block 1", "bytes"]
    # selective keeps more than full and no more than none
    sel = prof.get("fp32", "selective").saved_total
    assert prof.get("fp32", "full").saved_total <= sel <= none.saved_total
    # offloading leaves only what is saved outside the blocks on the device
    for policy in ("offload", "offload+checkpoint"):
        assert prof.get("fp32", policy).saved_total == outside, policy
    off = prof.get("fp32", "offload")
    in_blocks = none.saved_total - outside
    assert off.bytes_to_host - off.weight_bytes_to_host >= in_blocks  # views copied one by one
    assert prof.get("fp32", "offload+checkpoint").bytes_to_host == prof.n_blocks * block_in
    if kind in ("gpt2", "llama"):  # HF's own checkpointing keeps what ours keeps
        assert prof.get("fp32", "hf").saved_total == prof.get("fp32", "full").saved_total


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_gradients_do_not_change_with_any_policy(profiles, kind):
    _, prof = profiles[kind]
    for m in prof.measurements:
        assert m.grad_max_diff is not None and m.grad_max_diff <= 1e-6, (m.config.label,
                                                                         m.grad_max_diff)


def test_profile_matches_the_course_measure_on_its_gpt(profiles):
    _, prof = profiles["gpt"]
    for policy in ("none", "full", "selective"):
        cfg = config_for("smoke", batch_size=2, checkpoint=policy, device="cpu")
        ref = measure(cfg, timed=False)
        mine = prof.get("fp32", policy)
        for f in ("activations", "logits", "autocast_weight_copies", "parameters", "gradients"):
            assert getattr(mine, f) == getattr(ref, f), (policy, f)


def test_timed_profile_has_ratios_and_units():
    z = zoo("cnn")
    prof = profile(z.build, z.make_batch, batch_size=2, policies=("full",), steps=3,
                   progress=False, **z.kwargs())
    df = prof.table()
    assert list(df["label"]) == ["fp32", "fp32+full"]
    assert (df["step_time_s"] > 0).all() and prof.unit == "samples"
    assert df.loc[0, "time_verdict"] == "reference"
    assert len(prof.get("fp32", "full").step_times_s) == 3
    gpt = zoo("gpt")
    p2 = profile(gpt.build, gpt.make_batch, batch_size=2, policies=(), timed=False,
                 progress=False)
    assert p2.unit == "tokens" and p2.get("fp32", "none").config.tokens_per_step == 2 * 32


# --- clear errors --------------------------------------------------------------------------------

def test_a_loss_that_is_not_a_scalar_is_a_clear_error():
    z = zoo("cnn")
    with pytest.raises(ValueError, match=r"shape \(2, 10\), not a scalar"):
        profile(z.build, z.make_batch, forward=z.forward, batch_size=2, timed=False,
                progress=False)  # no loss_fn: the logits would be the loss


def test_a_model_that_does_not_fit_before_the_first_step():
    z = zoo("gpt")
    with pytest.raises(ModelDoesNotFit, match="does not fit before the first step"):
        profile(z.build, z.make_batch, batch_size=2, budget_bytes=1024, progress=False)


def test_other_bad_inputs():
    z = zoo("gpt")
    with pytest.raises(ValueError, match="valid policies"):
        profile(z.build, z.make_batch, policies=("sometimes",), progress=False)
    with pytest.raises(ValueError, match="Hugging Face"):
        profile(z.build, z.make_batch, policies=("hf",), timed=False, progress=False)
    with pytest.raises(ValueError, match="first dimension must be the batch"):
        profile(z.build, lambda n: z.make_batch(n + 1), batch_size=2, progress=False)
    with pytest.raises(TypeError, match="nn.Module"):
        profile("gpt2", z.make_batch, progress=False)


# --- the extrapolated estimate ------------------------------------------------------------------


# --- the card and the CLI -----------------------------------------------------------------------
