"""course_utils.evidence: the claims ledger's small measurements, each returning its rule's inputs,
and the readers of a compare table."""
from __future__ import annotations

import pytest
from helpers import TINY, measured_table

from course_utils import evidence, verdict
from course_utils.experiments import compare
from course_utils.memory_model import parameter_count


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
    with pytest.raises(ValueError, match=r"k \(micro-batches\) must be an integer >= 2"):
        evidence.accumulation(TINY, k=1)


def test_time_and_memory_between_rows():
    df = measured_table([("a", "fp32", [1.0, 1.1, 0.9, 1.0, 1.05], 1000, False),
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
