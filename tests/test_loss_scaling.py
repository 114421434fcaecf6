"""course_utils.loss_scaling: GradScaler's trace read (C12) and the size of an update (C18)."""
import pandas as pd
import pytest
import torch

from course_utils.claims import verdict
from course_utils.config import config_for
from course_utils.loss_scaling import read_scaler_trace, snapshot, update_norm
from course_utils.models import build_model


def get_batch_pair(cfg, i):
    from course_utils.data import get_batch
    return get_batch(cfg.batch_size, cfg.seq_len, step=i)


def _trace(inject, growth_interval=3, steps=12, tamper=None):
    torch.manual_seed(0)
    toy = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(toy.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    init = scaler.get_scale()
    rows = []
    for step in range(1, steps + 1):
        scaler.scale(toy(torch.randn(8, 4)).pow(2).mean()).backward()
        if step in inject:
            toy.weight.grad[0, 0] = inject[step]
        before = toy.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        rows.append({"step": step, "injected": step in inject, "scale": scaler.get_scale(),
                     "stepped": not torch.equal(before, toy.weight.detach())})
    if tamper:
        tamper(rows)
    return pd.DataFrame(rows), scaler, init


def test_read_scaler_trace_on_torchs_gradscaler():
    trace, scaler, init = _trace({2: float("inf"), 3: float("nan")})
    got = read_scaler_trace(trace, scaler, init)
    assert got == {"backoffs_ok": [True, True], "growth_after": [3, 3, 3],
                   "growth_interval": 3, "clean_taken": True}
    assert verdict("C12", **got).status == "held"
    # the same from a list of dicts
    assert read_scaler_trace(trace.to_dict("records"), scaler, init) == got


def test_read_scaler_trace_catches_a_broken_rule():
    def no_backoff(rows):  # a scaler that kept its scale after an overflow
        for r in rows:
            r["scale"] = rows[0]["scale"] if r["step"] <= 4 else r["scale"]

    trace, scaler, init = _trace({2: float("inf")}, tamper=no_backoff)
    got = read_scaler_trace(trace, scaler, init)
    assert got["backoffs_ok"] == [False]
    assert verdict("C12", **got).status == "busted"

    def stepped_on_inf(rows):
        rows[1]["stepped"] = True

    trace, scaler, init = _trace({2: float("inf")}, tamper=stepped_on_inf)
    assert read_scaler_trace(trace, scaler, init)["backoffs_ok"] == [False]
    with pytest.raises(ValueError, match="rows with"):
        read_scaler_trace([{"step": 1}], scaler, init)
    with pytest.raises(ValueError):
        read_scaler_trace([], scaler, init)


def test_update_norm_measures_the_change():
    lin = torch.nn.Linear(3, 2)
    before = snapshot(lin)
    assert update_norm(lin, before) == 0.0
    with torch.no_grad():
        lin.weight[0, 0] += 3.0
        lin.bias[1] -= 4.0
    assert update_norm(lin, before) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="snapshot"):
        update_norm(lin, before[:1])


def _one_update(make_optimizer, unscale_first, cfg):
    model = build_model(cfg)
    opt = make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler("cpu")
    before = snapshot(model)
    _, loss = model(*get_batch_pair(cfg, 0))
    scaler.scale(loss).backward()
    if unscale_first:
        scaler.unscale_(opt)
        seen = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    else:
        seen = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    return seen, update_norm(model, before)


def test_c18_mechanism_sgd_feels_the_scale_adamw_mostly_not():
    """Clipping before unscale_: the norm clipping sees is S x the true one; SGD's update
    shrinks by about the scale; AdamW's changes by far less (its normalisation hides it)."""
    cfg = config_for("smoke", device="cpu")
    S = torch.amp.GradScaler("cpu").get_scale()
    sgd = {o: _one_update(lambda p: torch.optim.SGD(p, lr=1e-3), o, cfg) for o in (True, False)}
    adam = {o: _one_update(lambda p: torch.optim.AdamW(p, lr=1e-3), o, cfg) for o in (True, False)}
    saw = sgd[False][0] / sgd[True][0]
    assert saw == pytest.approx(S, rel=1e-3)
    sgd_ratio = sgd[False][1] / sgd[True][1]
    adam_ratio = adam[False][1] / adam[True][1]
    assert sgd_ratio < 10 / S                  # about 1/S x (true norm / max_norm)
    assert 0.1 < adam_ratio <= 1.0             # Adam hides most of it
    v = verdict("C18", clip_saw_ratio=saw, scale=S, sgd_update_ratio=sgd_ratio,
                adamw_update_ratio=adam_ratio)
    assert v.status == "held" and "SGD" in v.evidence and "AdamW" in v.evidence
