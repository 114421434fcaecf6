"""course_utils.autocast_ops: what autocast runs per op, and in which dtype, recorded below
autograd; autocast's op lists read on this device."""
import pytest
import torch
from helpers import Tiny

from course_utils.autocast_ops import POLICY_PROBES, OpDtypeRecorder, autocast_policy
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.models import build_model


def test_recorder_sees_autocast_dtypes_and_modules():
    torch.manual_seed(0)
    m, x = Tiny(), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = m(x)
    with OpDtypeRecorder(m) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    assert torch.equal(out, expected)            # the hooks do not change outputs
    t = rec.table()
    ln = t[t["op"] == "native_layer_norm"]
    assert list(ln["module"]) == ["ln"] and ln["output"].iloc[0].startswith("fp32")
    mm = t[t["op"] == "addmm"]
    assert list(mm["module"]) == ["fc"] and list(mm["output"]) == ["bf16"]
    casts = t[t["op"] == "_to_copy"]
    assert sorted(casts["note"]) == ["cast of a weight", "cast of a weight",
                                     "cast of an activation"]   # weight, bias, LN output
    assert "view" not in set(t["op"]) and "t" not in set(t["op"])
    assert "t" in set(rec.table(views=True)["op"])
    # After the with-block the hooks are gone: nothing more is recorded.
    n = len(rec.records)
    m(x)
    assert len(rec.records) == n and not m._forward_hooks and not m.fc._forward_pre_hooks


def test_recorder_weight_cast_cache_on_the_course_model():
    cfg = config_for("smoke")
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    n_linear = sum(isinstance(mod, torch.nn.Linear) for mod in model.modules())
    n_bias = sum(isinstance(mod, torch.nn.Linear) and mod.bias is not None
                 for mod in model.modules())

    def casts(two_regions):
        with OpDtypeRecorder(model) as rec:
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    model(x, y)
                if not two_regions:
                    break
        return sum(r.op == "_to_copy" and r.reads_parameter for r in rec.records)

    assert casts(False) == n_linear + n_bias
    assert casts(True) == 2 * (n_linear + n_bias)


def test_recorder_without_model():
    a = torch.ones(2, dtype=torch.float16)
    with OpDtypeRecorder() as rec:
        a + 1
    t = rec.table()
    assert list(t["op"]) == ["add"] and t["module"].iloc[0] == "" and t["output"].iloc[0] == "fp16"


def get_batch_pair(cfg, i):
    from course_utils.data import get_batch
    return get_batch(cfg.batch_size, cfg.seq_len, step=i)


def test_autocast_policy_reads_this_devices_lists():
    t = autocast_policy("cpu", torch.bfloat16)
    assert list(t.index) == list(POLICY_PROBES)
    assert list(t.columns) == ["fp32 input", "bf16 input", "autocast here"]
    assert t.loc["linear (matmul)", "autocast here"] == "runs in bf16"
    assert t.loc["cross_entropy (the loss)", "autocast here"] == "runs in fp32"
    # the step inside it: CPU autocast casts cross_entropy's input up, so its log-softmax (saved
    # for backward) is fp32 here; on CUDA only nll_loss is listed and it follows its input
    assert t.loc["log_softmax inside cross_entropy", "bf16 input"] == "fp32"
    # CPU autocast (unlike CUDA's list) leaves layer_norm and softmax of a bf16 input in bf16
    assert t.loc["layer_norm", "autocast here"] == "follows its input"
    assert t.loc["softmax", "bf16 input"] == "bf16"
    t16 = autocast_policy("cpu", torch.float16)
    assert t16.loc["linear (matmul)", "fp32 input"] == "fp16"
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        autocast_policy("cpu", torch.float32)
    with pytest.raises(ValueError):
        autocast_policy("cuda:7" if not torch.cuda.is_available() else "nonsense")


def test_autocast_policy_says_its_rules_in_korean_and_keeps_its_english_labels(monkeypatch):
    """Issue 28: a Korean learner reads what autocast does in Korean; the probes (index) and the
    columns stay English, so code that looks them up works in both editions."""
    english = autocast_policy("cpu", torch.bfloat16)
    monkeypatch.setenv("COURSE_LANG", "ko")
    t = autocast_policy("cpu", torch.bfloat16)
    assert list(t.index) == list(english.index) and list(t.columns) == list(english.columns)
    assert t.loc["linear (matmul)", "autocast here"] == "bf16으로 실행"
    assert t.loc["cross_entropy (the loss)", "autocast here"] == "fp32로 실행"
    assert t.loc["layer_norm", "autocast here"] == "입력 dtype을 따름"
    assert t[["fp32 input", "bf16 input"]].equals(english[["fp32 input", "bf16 input"]])


def test_ops_by_dtype_groups_a_recording():
    cfg = config_for("smoke", device="cpu")
    model = build_model(cfg)
    x, y = get_batch_pair(cfg, 0)
    with OpDtypeRecorder(model) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, y)
    block = rec.ops_by_dtype(module="layers.0")
    assert "addmm" in block["bf16"] and "native_layer_norm" in block["fp32"]
    seen = [op for ops in block.values() for op in ops]
    assert "_to_copy" not in seen and "view" not in seen
    assert all(len(v) == len(set(v)) for v in block.values())
    everything = rec.ops_by_dtype()
    assert "nll_loss_forward" in everything["fp32"] and "nll_loss_forward" not in block.get("fp32", [])
    outside = rec.ops_by_dtype(exclude="layers")
    assert "nll_loss_forward" in outside["fp32"] and "embedding" in outside["fp32"]
    assert "gelu" not in [op for ops in outside.values() for op in ops]
