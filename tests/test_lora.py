"""course_utils.lora: the adapter, its frozen base and its memory arithmetic, and the routes to
fine-tune a 7B model on one GPU."""
from __future__ import annotations

import pytest
import torch
from helpers import TINY

from course_utils import build_model, lora
from course_utils.measure import memory_step, warm_up
from course_utils.memory_model import estimate, parameter_count
from course_utils.terms import GiB


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
    # no foreach temporaries at bitsandbytes' step (one parameter at a time, in place): the peak
    # is 4 + 4 + 2 bytes/param plus a block's backward, not the full fine-tune's minus 6 N
    assert 10 * n / GiB < routes.loc[adam8, "peak"] < 10 * n / GiB + 3   # + a block's backward
    assert routes.loc[adam8, "peak"] < routes.loc[full, "peak"] - 6 * n / GiB - 3
    assert routes.loc[lo, "peak"] * GiB == routes.loc[lo, "peak_bytes"]
    # each route's parts alive at its peak sum to its peak (the chart's bar ends there): the full
    # fine-tune peaks at the optimizer step, with foreach AdamW's 4 N bytes of temporaries
    parts = routes[[c for c in routes.columns if c.startswith("at peak: ")]]
    assert parts.sum(axis=1).to_numpy() == pytest.approx(routes["peak"].to_numpy())
    assert routes.loc[full, "peak at"] == "optimizer step"
    assert routes.loc[full, "at peak: temporaries"] == pytest.approx(4 * n / GiB, rel=0.01)
    assert routes.loc[full, "at peak: saved tensors"] == 0
    with pytest.raises(ValueError, match="unknown model"):
        lora.routes("13B")
    with pytest.raises(ValueError, match="accum"):
        lora.routes(accum=0)


def test_routes_name_themselves_in_korean_with_the_same_estimates(monkeypatch):
    """Issue 28: the route names (the table's index, the chart's labels) are Korean under
    COURSE_LANG=ko; the columns code reads and every estimate are the English run's."""
    english = lora.routes("7B", 24 * GiB, rank=16)
    monkeypatch.setenv("COURSE_LANG", "ko")
    korean = lora.routes("7B", 24 * GiB, rank=16)
    assert list(korean["route"]) == ["전체 파인튜닝 (bf16 autocast + 체크포인팅)",
                                     "LoRA r=16, 고정된 bf16 기반 모델 (+ 체크포인팅)",
                                     "다음 단계: QLoRA r=16, NF4 기반 모델 (+ 체크포인팅)",
                                     "다음 단계: 8비트 AdamW, 전체 파인튜닝"]
    assert korean.drop(columns="route").equals(english.drop(columns="route"))
    with pytest.raises(ValueError, match=r"^알 수 없는 모델 '3B'"):
        lora.routes("3B")
