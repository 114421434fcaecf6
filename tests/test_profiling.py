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
from helpers import synthetic_profile, zoo

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
from course_utils.terms import MiB

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
    # MiB = bytes / 2**20 exactly (a power of two): the byte counts come back exact
    assert list(full.columns) == ["MiB"]
    assert all(full.loc[w, "MiB"] * MiB == block_in for w in blocks)
    outside = prof.saved_by_block("fp32", "none").loc["outside the blocks", "MiB"] * MiB
    assert full.loc["outside the blocks", "MiB"] * MiB == outside
    # every-2 checkpoints block 0 of 2: block 0 keeps its input, block 1 all it saves
    plain = prof.saved_by_block("fp32", "none")
    every = prof.saved_by_block("fp32", "every-2")
    assert every.loc["block 0", "MiB"] * MiB == block_in
    if kind == "llama":  # rotary cos/sin are shared by the blocks: counted where first saved
        assert every.loc["block 1", "MiB"] > plain.loc["block 1", "MiB"]
    else:
        assert every.loc["block 1", "MiB"] == plain.loc["block 1", "MiB"]
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


# --- the readable tables: one statistic for the milliseconds and the ratio ----------------------

#: Lesson 05 on a loaded 2-core CPU: each row's own median came from another round than its
#: reference's, so the medians gave 2.4x where the per-round ratio was 1.25x (there: 2.08x next
#: to 1.22x). A table must not print both.
DRIFT = {"none": [1.0, 2.0, 1.0, 2.0, 1.0, 1.0], "full": [2.6, 2.4, 2.4, 2.6, 1.2, 1.2],
         "selective": [1.1, 2.1, 1.1, 2.2, 1.2, 1.0], "offload": [1.0, 2.0, 1.0, 2.0, 1.0, 1.0]}


def test_a_row_prints_one_statistic_for_its_milliseconds_and_its_ratio():
    import re
    prof = synthetic_profile(DRIFT)
    full = prof.get("fp32", "full")
    r = prof.ratio(full)
    assert (round(r.ratio, 2), r.verdict) == (1.25, "slower")
    assert full.step_time_s / prof.get("fp32", "none").step_time_s == pytest.approx(2.4)
    s = prof.summary()
    assert s.shape[1] + 1 <= 7 and "fp32 + full checkpointing" in s.index
    # the milliseconds are the reference's median times the per-round ratio: they agree
    ref_ms = s.loc["fp32", "step ms"]
    for label, row in s.iterrows():
        cell = row["time vs none"]
        assert not re.search(r"0\.\d+x faster", cell)
        m = re.match(r"(\d+\.\d+)x (slower|faster) \((\d+\.\d+)-(\d+\.\d+)x\)", cell)
        if m:
            ratio, lo, hi = float(m[1]), float(m[3]), float(m[4])
            assert lo <= ratio <= hi and not lo <= 1.0 <= hi, cell
            shown = ratio if m[2] == "slower" else 1 / ratio
            assert row["step ms"] / ref_ms == pytest.approx(shown, abs=0.01), label
        else:
            assert cell == "1.00x (reference)" or cell.startswith("within noise ("), cell
    # the band reaches the medians' 2.40x (course_utils.step_timing); the milliseconds follow 1.25x
    assert s.loc["fp32 + full checkpointing", "time vs none"] == "1.25x slower (1.20-2.40x)"
    assert s.loc["fp32 + full checkpointing", "step ms"] == 1250.0
    assert s.loc["fp32 + full checkpointing", "tokens/s"] == "410"   # 512 tokens / 1.25 s
    # nothing moved to the host: no column for it; offloading ran: a column, named for the device
    assert not any("host" in c for c in s.columns)
    moved = synthetic_profile(DRIFT, moved=3 * MiB).summary()
    assert list(moved.columns)[-1] == "would go to host MiB" and moved.shape[1] + 1 <= 7
    gpu = synthetic_profile(DRIFT, moved=3 * MiB, device="cuda").summary()
    assert "to host MiB" in gpu.columns
    detail = prof.summary(detail=True)
    assert {"own median step ms", "saved x", "max |grad diff|"} <= set(detail.columns)
    assert detail.loc["fp32 + full checkpointing", "own median step ms"] == 2400.0


def test_a_faster_row_prints_a_speed_up_with_its_band_in_that_direction():
    prof = synthetic_profile({"none": [1.0, 1.1, 1.0, 1.2, 1.0, 1.1],
                              "full": [0.70, 0.77, 0.71, 0.84, 0.69, 0.78]})
    cell = prof.summary().loc["fp32 + full checkpointing", "time vs none"]
    assert cell.startswith("1.4") and "faster" in cell
    lo, hi = (float(v) for v in cell.split("(")[1].rstrip("x)").split("-"))
    assert lo <= float(cell.split("x")[0]) <= hi


def test_the_gradient_sentence_says_bit_for_bit_or_by_how_much():
    prof = synthetic_profile({"none": [1.0] * 6, "full": [1.3] * 6})
    assert prof.gradients_text().endswith("over all 2 configurations: bit-for-bit equal")
    prof.get("fp32", "full").grad_max_diff, prof.get("fp32", "full").grad_scale = 2.44e-4, 24.3
    text = prof.gradients_text()
    assert "equal to within 0.00024 (the largest gradient is 24.3), not bit for bit" in text
    assert "GPU" not in text  # a CPU's kernels are deterministic: no GPU excuse on a CPU
    gpu = synthetic_profile({"none": [1.0] * 6, "full": [1.3] * 6}, device="cuda")
    gpu.get("fp32", "full").grad_max_diff = 2.44e-4
    assert "GPU kernels that add in a varying order" in gpu.gradients_text()


def test_a_factory_model_is_read_on_meta_and_built_on_the_device():
    # Building lesson 05's models on a 2-thread CPU, to read their blocks or to move them to a
    # GPU afterwards, took most of its time on an H200: the template is built on the meta
    # device (no memory, no initialisation), each configuration on its device.
    from course_utils.profiling import to_device
    built_on = []

    def factory():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        built_on.append(m[0].weight.device.type)
        return m
    spec = ModelSpec.create(factory, lambda n: torch.randn(n, 4), device="cpu")
    assert built_on == ["meta"] and spec.blocks == ""
    model = spec.fresh("full")
    assert built_on == ["meta", "cpu"] and isinstance(model[0], CheckpointedBlock)
    assert next(model.parameters()).device.type == "cpu"

    def reads_its_weights():  # .item() cannot run on meta: built as it is, with the same blocks
        m = factory()
        m[0].weight.sum().item()
        return m
    spec = ModelSpec.create(reads_its_weights, lambda n: torch.randn(n, 4), device="cpu")
    assert built_on[-2:] == ["meta", "cpu"] and spec.skeleton()[0].weight.device.type == "cpu"
    # a module given (not a factory) is read as it is, never rebuilt
    given = factory()
    spec = ModelSpec.create(given, lambda n: torch.randn(n, 4), device="cpu")
    assert spec.skeleton() is given and spec.fresh("none") is not given
    batch = to_device({"x": torch.ones(2), "flag": False, "pair": (torch.zeros(1), 3)}, "meta")
    assert batch["x"].is_meta and batch["pair"][0].is_meta and batch["flag"] is False
    assert batch["pair"][1] == 3
