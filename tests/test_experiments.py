"""course_utils.experiments: the ladder a machine compares."""
from types import SimpleNamespace

import torch

from course_utils import hardware
from course_utils.config import config_for
from course_utils.experiments import ladder


def fake_cuda(monkeypatch, name, cc, mem_gib):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=name, total_memory=int(mem_gib * 2**30)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: cc)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(mem_gib * 2**30 * 0.9),
                                                                int(mem_gib * 2**30)))

    def is_bf16_supported(including_emulation=True):
        # What torch reports: True on a T4 when emulation counts (including_emulation=True).
        return True if including_emulation else cc >= (8, 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


def fake_cpu(monkeypatch, **flags):
    caps = {"cpu_name": "Test CPU", "avx2": True, **flags}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps, raising=False)  # absent before 2.7
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)


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
