"""The run guard (course_utils.guard): refusals before a run, and the memory it counts as free:
free RAM or a container's cgroup limit (v1 and v2, read from fake cgroup folders), whichever
is smaller."""
import pytest
import torch
from helpers import fake_cpu, fake_machine, write

from course_utils import guard, hardware
from course_utils.config import config_for
from course_utils.guard import MemoryRefused, cgroup_memory, check_feasible, memory_headroom
from course_utils.hardware import HardwareInfo
from course_utils.memory_model import estimate
from course_utils.terms import GiB, MiB

CPU = HardwareInfo(device="cpu", name="test CPU", cpu_features={"avx2": True}, bf16_emulated=True)


def test_cgroup_v2_limit_minus_usage_counting_the_file_cache_as_free(tmp_path):
    root = write(tmp_path, memory__max=str(2 * GiB), memory__current=str(GiB + 300 * MiB),
                 memory__stat=f"anon {GiB}\ninactive_file {300 * MiB}\n")
    cg = cgroup_memory(root, proc_cgroup=str(tmp_path / "missing"))
    assert (cg.version, cg.limit, cg.usage) == (2, 2 * GiB, GiB + 300 * MiB)
    assert cg.headroom == GiB and "cgroup v2: 2.00 GiB, 1.00 GiB in use" in cg.describe()


def test_no_limit_reads_as_none(tmp_path):
    write(tmp_path / "v2", memory__max="max", memory__current=str(GiB))
    assert cgroup_memory(tmp_path / "v2", proc_cgroup=str(tmp_path / "missing")) is None
    write(tmp_path / "v1" / "memory", memory__limit_in_bytes="9223372036854771712",
          memory__usage_in_bytes=str(GiB))
    assert cgroup_memory(tmp_path / "v1", proc_cgroup=str(tmp_path / "missing")) is None
    assert cgroup_memory(tmp_path / "nothing", proc_cgroup=str(tmp_path / "missing")) is None


def test_cgroup_v1_and_the_tightest_limit_above_the_process(tmp_path):
    proc = tmp_path / "self_cgroup"
    proc.write_text("12:pids:/\n4:memory:/kubepods/pod1\n0::/\n")
    write(tmp_path / "memory", memory__limit_in_bytes="9223372036854771712",
          memory__usage_in_bytes=str(5 * GiB))
    write(tmp_path / "memory" / "kubepods", memory__limit_in_bytes=str(3 * GiB),
          memory__usage_in_bytes=str(2 * GiB))
    write(tmp_path / "memory" / "kubepods" / "pod1", memory__limit_in_bytes=str(4 * GiB),
          memory__usage_in_bytes=str(GiB), memory__stat="total_inactive_file 0\n")
    cg = cgroup_memory(tmp_path, proc_cgroup=str(proc))
    assert cg.version == 1 and cg.path.endswith("kubepods") and cg.headroom == GiB


def test_headroom_is_the_smaller_of_free_ram_and_the_cgroup(tmp_path, monkeypatch):
    fake_machine(tmp_path, monkeypatch, ram=64 * GiB, limit=2 * GiB, usage=GiB)
    free, where = memory_headroom(CPU)
    assert free == GiB and "container's memory limit (cgroup v2" in where
    fake_machine(tmp_path, monkeypatch, ram=512 * MiB, limit=2 * GiB, usage=GiB)
    assert memory_headroom(CPU) == (512 * MiB, "of RAM free now")
    fake_machine(tmp_path, monkeypatch, ram=8 * GiB, limit=None, usage=GiB)
    assert memory_headroom(CPU) == (8 * GiB, "of RAM free now")
    assert guard.available_memory_bytes(CPU) == 8 * GiB
    assert memory_headroom(HardwareInfo(device="mps", name="Apple MPS"))[0] is None


def test_a_cgroup_limit_below_free_ram_refuses_what_free_ram_would_accept(tmp_path, monkeypatch):
    big = config_for("cpu", device="cpu", batch_size=64)  # estimated peak ~0.6 GiB
    peak = estimate(big).peak_allocated
    fake_machine(tmp_path, monkeypatch, ram=64 * GiB, limit=None)
    check_feasible(big, CPU)  # the host's RAM: accepted
    fake_machine(tmp_path, monkeypatch, ram=64 * GiB, limit=peak + 256 * MiB, usage=400 * MiB)
    with pytest.raises(MemoryRefused, match=r"container's memory limit \(cgroup v2") as e:
        check_feasible(big, CPU)
    fits = int(str(e.value).split("batch ")[-1].split(" fits")[0])
    headroom = peak + 256 * MiB - 400 * MiB
    assert estimate(big.replace(batch_size=fits)).peak_allocated <= 0.8 * headroom
    assert estimate(big.replace(batch_size=fits + 1)).peak_allocated > 0.8 * headroom
    assert any("estimated peak" in n for n in check_feasible(big, CPU, force=True))


def test_the_batch_search_stays_under_the_cgroup_limit(tmp_path, monkeypatch):
    """`search.largest_batch` under a budget far above a container's limit: batches whose
    estimate does not fit under the limit are refused (recorded as not fitting), not run."""
    from course_utils import search
    fake_machine(tmp_path, monkeypatch, ram=64 * GiB, limit=GiB, usage=GiB - 30 * MiB)
    cfg = config_for("smoke", device="cpu")
    found = search.largest_batch(cfg, 4 * GiB, max_batch=256, steps=1)
    room = 0.8 * 30 * MiB

    def est(b):
        return estimate(cfg.replace(batch_size=b)).peak_allocated
    assert found.batch_size >= 1 and est(found.batch_size) <= room
    refused = [p for p in found.probes if p.oom]
    assert refused and all(est(p.batch_size) > room and p.peak_allocated is None for p in refused)


def test_a_run_larger_than_free_memory_is_refused_with_a_batch_that_fits(monkeypatch):
    monkeypatch.setattr(guard, "memory_headroom", lambda hw: (4 * GiB, "of RAM free now"))
    hw = hardware.detect("cpu")
    big = config_for("cpu", device="cpu", batch_size=100_000)
    with pytest.raises(MemoryRefused, match=r"batch \d+ fits") as e:
        check_feasible(big, hw)
    fits = int(str(e.value).split("batch ")[-1].split(" fits")[0])
    assert estimate(big.replace(batch_size=fits)).peak_allocated <= 0.8 * 4 * GiB
    assert estimate(big.replace(batch_size=fits + 1)).peak_allocated > 0.8 * 4 * GiB
    assert any("estimated peak" in n for n in check_feasible(big, hw, force=True))


def test_mps_runs_are_told_that_their_peak_is_measured_on_the_cpu():
    mps = HardwareInfo(device="mps", name="Apple MPS", native_bf16=True, fp16_fast=True)
    notes = check_feasible(config_for("smoke", device="cpu", precision="bf16"), mps)
    assert hardware.MPS_PEAK_NOTE in notes and "no peak-memory counter" in hardware.MPS_PEAK_NOTE


def test_the_cuda_memory_cap_names_the_device_by_index_and_lifts_itself(monkeypatch):
    # torch refuses a device without an index here ("Expected a torch.device with a specified
    # index", torch 2.11 on an H100): the cap passes the index of "cuda" and of "cuda:1".

    calls = []

    def fraction(f, device):
        if not isinstance(device, int):
            raise ValueError(f"Expected a torch.device with a specified index, got {device}")
        calls.append((round(f, 3), device))

    class Props:
        total_memory = 80 * GiB
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fraction)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("emptied"))
    with guard.cuda_memory_cap("cuda", 20 * GiB) as total:
        assert total == 80 * GiB and calls == [(0.25, 0)]
    with pytest.raises(RuntimeError), guard.cuda_memory_cap("cuda:1", 100 * GiB):
        raise RuntimeError("a step that fails")
    assert calls == [(0.25, 0), (1.0, 0), "emptied", (1.0, 1), (1.0, 1), "emptied"]


def test_cpu_without_bf16_notes_but_runs(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True)
    notes = check_feasible(config_for("smoke", device="cpu", precision="bf16"),
                           hardware.detect("cpu"))
    assert any("emulated" in n for n in notes)


def test_fp16_on_cpu_refused_unless_tiny(monkeypatch):
    fake_cpu(monkeypatch, avx512_f=True, avx512_bf16=True)
    hw = hardware.detect("cpu")
    with pytest.raises(ValueError, match="emulated"):
        check_feasible(config_for("cpu", device="cpu", precision="fp16"), hw)
    assert check_feasible(config_for("cpu", device="cpu", precision="fp16"), hw, force=True)
    check_feasible(config_for("smoke", device="cpu", precision="fp16"), hw)  # tiny: allowed
