"""What lesson 03 adds to course_utils: the ledger's small measurements (evidence), the check
of a training step from the outside (StepProbe), the LoRA adapter and its memory arithmetic
(lora), and the charts of the order of adoption and of the fine-tuning routes. CPU, ``smoke``
size: seconds."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from course_utils import build_model, evidence, get_batch, lora, plots, verdict
from course_utils.config import GiB
from course_utils.experiments import compare
from course_utils.measure import Measurement, memory_step, warm_up
from course_utils.memory_model import estimate, parameter_count
from course_utils.plots.ladder import adoption_story
from course_utils.training import train_step

TINY = evidence.small_config()


# --------------------------------------------------------------- the ledger's small measurements

def test_sqrt_segments_c6():
    got = evidence.sqrt_segments(TINY)
    assert got["plain_growth"] == pytest.approx(4, rel=0.02)     # N -> 4N blocks: 4x the bytes
    assert got["sqrt_growth"] == pytest.approx(2, rel=0.02)      # sqrt(N) segments: 2x
    assert got["sqrt_segments"] == 4
    assert got["best_segments"] == 16    # a block keeps ~16x its input: one segment per block wins
    assert verdict("C6", **got).status == "depends"


def test_checkpoint_keeps_c8_block_inputs_not_parameters():
    got = evidence.checkpoint_keeps(TINY)
    B, T, d, L = TINY.batch_size, TINY.seq_len, TINY.d_model, TINY.n_layers
    assert got["kept_bytes"] == got["expected_bytes"] == L * B * T * d * 4 + 8 * B * T + 8 * T
    assert got["param_bytes"] == 4 * parameter_count(TINY)
    assert verdict("C8", **got).status == "busted"


def test_reentrant_pitfalls_c14():
    got = evidence.reentrant_pitfalls(TINY)
    assert got["reentrant_lost_grads"] is True and got["nonreentrant_ok"] is True
    assert set(got["reentrant_failures"]) == {"torch.autograd.grad", "keyword arguments",
                                              "context_fn (selective checkpointing)"}
    assert verdict("C14", **got).status == "held"


def test_attention_growth_c15():
    got = evidence.attention_growth(TINY)
    assert got["sdpa_slope"] == pytest.approx(1.0, abs=0.05)        # O(seq)
    assert got["naive_extra_slope"] == pytest.approx(2.0, abs=0.05)  # the seq x seq matrices
    assert verdict("C15", **got).status == "depends"


def test_fp16_underflow_and_bf16_range_c11_c13():
    fp16 = evidence.fp16_underflow(TINY)
    assert fp16["scale"] == 2.0**16
    assert 0 < fp16["flushed_unscaled"] < 0.05 and fp16["flushed_scaled"] < fp16["flushed_unscaled"]
    assert fp16["overflow_scaled"] == 0
    assert verdict("C11", **fp16).status == "held"
    bf16 = evidence.bf16_range(TINY)
    assert bf16 == {"same_range": True, "flushed_bf16": 0.0, "which": "parameter gradients"}
    assert verdict("C13", **bf16).status == "held"
    assert "of the parameter gradients" in verdict("C11", **fp16).evidence


def test_scaler_trace_c12():
    got = evidence.scaler_trace(growth_interval=3, clean_steps=6)
    assert got == {"backoffs_ok": [True], "growth_after": [3, 3], "growth_interval": 3,
                   "clean_taken": True}
    assert verdict("C12", **got).status == "held"


def test_clip_order_c18():
    got = evidence.clip_order(TINY)
    assert got["clip_saw_ratio"] == pytest.approx(got["scale"], rel=1e-3) and got["scale"] == 2.0**16
    assert got["sgd_update_ratio"] < 1e-3          # SGD's update shrank by about the scale
    assert 0.05 < got["adamw_update_ratio"] <= 1.0  # Adam hides most of it
    assert verdict("C18", **got).status == "held"


# --------------------------------------------------------------- checking a step from the outside

def _manual_grads(cfg, micro):
    model = build_model(cfg)
    for x, y in micro:
        _, loss = model(x, y)
        (loss / len(micro)).backward()
    return [p.grad for p in model.parameters()]


def test_step_gradients_sees_what_the_optimizer_receives():
    micro = [get_batch(2, TINY.seq_len, step=i) for i in range(2)]
    got = evidence.step_gradients(train_step, build_model(TINY), micro)
    assert got["steps"] == 1 and got["zeroed"] and got["saved"] is None
    assert evidence.relative_error(got["grads"], _manual_grads(TINY, micro)) < 1e-6
    assert got["loss"] == pytest.approx(sum(build_model(TINY)(x, y)[1].item() for x, y in micro) / 2,
                                        rel=1e-5)
    full = evidence.step_gradients(train_step, build_model(TINY.replace(checkpoint="full")), micro[:1],
                                   meter=True)
    assert sum(full["saved"].values()) == estimate(TINY.replace(checkpoint="full", batch_size=2)).saved_total


def _step_without_unscale(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
    for x, y in micro_batches:
        _, loss = model(x, y)
        scaler.scale(loss / len(micro_batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss


def test_a_step_without_unscale_is_caught_only_with_an_enabled_scaler():
    micro = [get_batch(TINY.batch_size, TINY.seq_len, step=1)]

    def run(step_fn, enabled):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, enabled=enabled)
        return evidence.step_gradients(step_fn, build_model(TINY), micro, scaler=scaler,
                                       max_grad_norm=0.01)["grads"]
    assert evidence.relative_error(run(_step_without_unscale, False), run(train_step, False)) < 1e-6
    assert evidence.relative_error(run(_step_without_unscale, True), run(train_step, True)) > 0.9


def test_relative_error_refuses_mismatches():
    a = [torch.ones(3)]
    assert evidence.relative_error(a, [torch.ones(3)]) == 0
    assert evidence.relative_error(a, [torch.ones(4)]) == math.inf
    assert evidence.relative_error([], a) == math.inf and evidence.relative_error([None], a) == math.inf


def test_accumulation_c17_depends_for_train_step_and_is_busted_without_the_division():
    got = evidence.accumulation(TINY, k=4)
    assert got["grad_rel_err"] < 1e-5 and got["undivided_ratio"] == pytest.approx(4, rel=1e-4)
    assert 0 < got["extra_peak_bytes"] <= 1.05 * got["grad_buffer_bytes"]
    assert got["grad_buffer_bytes"] == 4 * parameter_count(TINY) and got["peak_vs_big"] < 1
    # "no extra memory" is not quite true: the .grad buffer lives across micro-batches
    assert verdict("C17", **got).status == "depends"

    def undivided(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
        for x, y in micro_batches:
            _, loss = model(x, y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    bad = evidence.accumulation(TINY, k=4, step_fn=undivided)
    assert bad["grad_rel_err"] == pytest.approx(3, rel=0.01)
    assert verdict("C17", **bad).status == "busted"
    with pytest.raises(ValueError, match="k >= 2"):
        evidence.accumulation(TINY, k=1)


# --------------------------------------------------------------- reading a compare() table

def _table(rows, size="cpu"):
    ms = []
    for _label, precision, times, peak, emulated in rows:
        m = Measurement(config=TINY.replace(precision=precision), peak_allocated=peak, emulated=emulated,
                        activations=peak // 2, autocast_weight_copies=0, logits=peak // 4,
                        parameters=400, gradients=400, optimizer_state=800)
        m.add_times(times)
        ms.append(m)
    df = pd.DataFrame([m.as_row() for m in ms])
    df["label"] = [r[0] for r in rows]
    df.attrs.update(measurements=ms, size=size)
    return df


def test_time_and_memory_between_rows():
    df = _table([("a", "fp32", [1.0, 1.1, 0.9, 1.0, 1.05], 1000, False),
                 ("b", "fp32", [1.3, 1.4, 1.2, 1.3, 1.35], 800, False),
                 ("c", "fp32", [1.0, 1.2, 0.8, 1.1, 0.9], 900, False),
                 ("d", "bf16", [3.0], 700, True)])
    assert evidence.time_between(df, "b", "a").verdict == "slower"
    assert evidence.time_between(df, "c", "a").verdict == "within noise"
    assert evidence.time_between(df, "d", "a").verdict == "emulated"
    assert evidence.memory_between(df, "b", "a") == {"peak_ratio": 0.8, "saved_ratio": 0.8,
                                                     "activations_ratio": 0.8}
    with pytest.raises(ValueError, match="no row 'z'"):
        evidence.time_between(df, "z", "a")
    state = evidence.training_state(df, "a")
    assert state["bytes_per_param"] == pytest.approx(1600 / TINY.shape.n_parameters)


def test_training_state_c9_on_a_measured_autocast_row():
    df = compare([TINY, TINY.replace(precision="bf16")], timed=False, progress=False)
    got = evidence.training_state(df, "bf16", {"tiny, batch 64": TINY.replace(batch_size=64)})
    assert got["bytes_per_param"] == pytest.approx(16, abs=0.01)
    assert got["copies_per_param"] > 0
    assert got["overheads"]["tiny, batch 64"] > 0.3
    assert verdict("C9", **got).status == "depends"


# --------------------------------------------------------------- LoRA

def test_lora_linear_starts_at_the_base_and_trains_only_adapters():
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 6)
    layer = lora.LoRALinear(base, rank=2, alpha=4.0)
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), base(x))       # B = 0: the base model at the start
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["lora_a", "lora_b"]
    layer(x).sum().backward()
    assert base.weight.grad is None and layer.lora_b.grad is not None
    with torch.no_grad():
        layer.lora_b.fill_(1.0)
    want = base(x) + x @ layer.lora_a.t() @ layer.lora_b.t() * 2.0
    assert torch.allclose(layer(x), want)


def test_add_lora_freezes_a_bf16_base_with_fp32_adapters():
    model = lora.add_lora(build_model(TINY), rank=4, targets=("qkv", "fc2"))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == 2 * 2 * TINY.n_layers and all(p.dtype == torch.float32 for p in trained.values())
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in frozen)
    assert sum(p.numel() for p in trained.values()) == lora.adapter_count(TINY, 4, ("qkv", "fc2"))
    assert sum(p.numel() for p in frozen) == parameter_count(TINY)
    with pytest.raises(ValueError, match="targets"):
        lora.adapter_count(TINY, 4, ("wq",))
    with pytest.raises(ValueError, match="rank"):
        lora.adapter_count(TINY, 0)


@pytest.mark.parametrize("batch_size, accum", [(4, 1), (2, 2)])
def test_lora_estimate_matches_a_measured_lora_step(batch_size, accum):
    cfg = TINY.replace(precision="bf16", checkpoint="full", batch_size=batch_size, grad_accum_steps=accum)
    state = lora.setup(cfg, rank=8)
    warm_up(state, tiny=True)
    got, want = memory_step(state), lora.estimate(cfg, rank=8)
    for field in ("parameters", "gradients", "optimizer_state", "activations", "autocast_weight_copies",
                  "logits"):
        assert got[field] == getattr(want, field), field
    assert got["peak_allocated"] == pytest.approx(want.peak_allocated, rel=0.25)
    # what LoRA shrinks, against the same model fully fine-tuned (estimate of fp32 training state)
    full = estimate(cfg)
    assert got["gradients"] * (full.n_parameters / want.n_adapter) == full.gradients
    assert got["optimizer_state"] < 0.2 * full.optimizer_state


def test_lora_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="bf16"):
        lora.setup(TINY)
    with pytest.raises(ValueError, match="checkpoint='full'"):
        lora.estimate(TINY.replace(precision="bf16"))


def test_routes_7b_on_24_gib():
    routes = lora.routes("7B", 24 * GiB, rank=16, micro_batch=1, accum=16).set_index("route")
    full, lo, q, adam8 = routes.index
    n = 6.71e9
    assert not routes.loc[full, "fits"]
    assert routes.loc[full, "weights"] == pytest.approx(4 * n / GiB, rel=0.01)
    assert routes.loc[lo, "fits"] and routes.loc[lo, "weights"] == pytest.approx(2 * n / GiB, rel=0.02)
    assert routes.loc[lo, "optimizer"] < 0.01 * routes.loc[full, "optimizer"]
    assert routes.loc[q, "weights"] < 0.4 * routes.loc[lo, "weights"] and routes.loc[q, "fits"]
    assert routes.loc[adam8, "optimizer"] == pytest.approx(routes.loc[full, "optimizer"] / 4, rel=0.01)
    assert not routes.loc[adam8, "fits"]
    assert routes.loc[lo, "peak"] * GiB == routes.loc[lo, "peak_bytes"]
    with pytest.raises(ValueError, match="unknown model"):
        lora.routes("13B")
    with pytest.raises(ValueError, match="accum"):
        lora.routes(accum=0)


# --------------------------------------------------------------- charts

def test_adoption_story_skips_an_emulated_step_as_reference():
    df = _table([("fp32", "fp32", [1.0, 1.02, 0.98, 1.0, 1.0], 1000, False),
                 ("bf16", "bf16", [3.0], 800, True),
                 ("fp32+full", "fp32", [1.3, 1.32, 1.28, 1.3, 1.3], 600, False)])
    story = adoption_story(df, [("fp32", "fp32"), ("+ bf16", "bf16"), ("+ compile", None),
                                      ("+ full", "fp32+full")], estimates=[("+ shard", 300)])
    assert list(story["source"]) == ["measured", "measured", "not measured here", "measured", "estimate"]
    assert list(story["adopted"]) == [True, False, True, True, True]
    assert story["time_verdict"].tolist()[:2] == ["reference", "emulated"]
    assert story.loc[3, "time_verdict"] == "slower" and story.loc[3, "time_ratio"] == pytest.approx(1.3)
    fig = plots.adoption_chart(story, size="cpu")
    mem = [t.get_text() for t in fig.axes[1].texts]
    assert "0.80x" in mem and "0.60x" in mem    # + full against fp32, not against emulated bf16
    assert any("0.50x" in t and "estimate" in t for t in mem)
    times = [t.get_text() for t in fig.axes[0].texts]
    assert "1.30x slower" in times and "emulated:\nnot drawn" in times
    assert "previous adopted step" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="no row"):
        adoption_story(df, [("x", "nope")])


def test_routes_chart_marks_what_fits():
    routes = lora.routes()
    fig = plots.routes_chart(routes, gpu_gib=24, title="7B", size="cpu")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert sum("does not fit" in t for t in texts) == 2 and sum(t.endswith(": fits") for t in texts) == 2
    assert "24 GiB GPU" in texts
    assert [line.get_xdata()[0] for line in ax.lines] == [24]
    assert fig._suptitle.get_text() == "7B, size 'cpu'"
    with pytest.raises(ValueError):
        plots.routes_chart(routes.iloc[:0])
    with pytest.raises(ValueError, match="gpu_gib"):
        plots.routes_chart(routes, gpu_gib=0)
    assert np.isfinite(ax.get_xlim()[1])
