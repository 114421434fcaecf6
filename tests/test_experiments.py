"""course_utils.experiments: the ladder a machine compares."""


from helpers import fake_cpu, fake_cuda

from course_utils import hardware
from course_utils.config import config_for
from course_utils.experiments import ladder


def test_ladder_pairs_differ_by_one_technique(monkeypatch):
    """Where the recipe is fp32, checkpointing is compared in fp32 and bf16 is measured for its
    memory; where it is bf16, the checkpointing pair is in bf16."""
    base = config_for("smoke", device="cpu")
    fake_cpu(monkeypatch, avx512_f=True)
    rows = [(c.precision, c.checkpoint) for c in ladder(base, hardware.detect("cpu"))]
    assert rows == [("fp32", "none"), ("fp32", "full"), ("fp32", "selective"), ("bf16", "none")]
    fake_cpu(monkeypatch, avx512_f=True, avx512_bf16=True)
    rows = [(c.precision, c.checkpoint) for c in ladder(base, hardware.detect("cpu"))]
    assert rows == [("fp32", "none"), ("bf16", "none"), ("bf16", "full"), ("bf16", "selective")]
    fake_cuda(monkeypatch, "Tesla T4", (7, 5), 15)
    rows = [(c.precision, c.checkpoint) for c in ladder(base.replace(device="cuda"),
                                                         hardware.detect("cuda"))]
    assert rows == [("fp32", "none"), ("fp16", "none"), ("fp16", "full"), ("fp16", "selective")]
