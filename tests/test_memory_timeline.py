"""course_utils.memory_timeline: when bytes are allocated over one step (CPU profiler events, CUDA
allocator history parsed), phases, peak and what stays allocated."""
import pytest
import torch

from course_utils import memory_timeline as timeline_module
from course_utils import search
from course_utils.memory_timeline import (
    Phase,
    Timeline,
    allocated_after,
    memory_timeline,
    peak_bytes,
    peak_during,
    phase,
)
from course_utils.terms import MiB


def test_peak_during_sees_a_temporary_and_returns_the_value():
    n = 4 * MiB // 4  # 4 MiB of fp32

    def work():
        tmp = torch.ones(n)  # freed before returning
        return float(tmp.sum()) + 1

    peak, value = peak_during(work, "cpu")
    assert value == n + 1
    assert 4 * MiB <= peak < 5 * MiB


def test_peak_during_and_budget_on_missing_devices():
    assert peak_during(lambda: 7, "mps") == (None, 7)  # no peak counter: None, never 0
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            search.memory_budget(0.5)
    with pytest.raises(ValueError):
        search.memory_budget(0.0)
    with pytest.raises(ValueError):
        search.memory_budget(1.5)




def test_memory_timeline_sees_an_allocation_and_its_free():
    def fn():
        with phase("make"):
            a = torch.ones(MiB // 4)  # 1 MiB of fp32
            b = torch.ones(MiB // 2)  # 2 MiB, freed before returning
            del b
        with phase("keep"):
            return a * 2  # 1 MiB more, returned

    tl = memory_timeline(fn)
    assert tl.device == "cpu" and "profiler" in tl.method
    assert len(tl.t_ms) == len(tl.allocated) > 0
    assert tl.t_ms == sorted(tl.t_ms)
    assert tl.peak_bytes >= 3 * MiB  # a and b alive together
    assert tl.final_bytes == MiB  # only the result: b was deleted, a went with fn's frame
    assert isinstance(tl.result, torch.Tensor) and tl.result.numel() == MiB // 4
    assert [p.name for p in tl.phases] == ["make", "keep"]
    make, keep = tl.phases
    assert make.start_ms <= make.end_ms <= keep.start_ms <= keep.end_ms
    assert tl.phase_peak("make") >= 3 * MiB
    where, elapsed = tl.peak_moment()  # a and b alive together: inside "make", after both allocations
    assert where == "make" and 0 < elapsed <= 1
    assert Timeline(device="cpu", method="test").peak_moment() == (None, None)


def test_timeline_errors_and_no_op_phase():
    tl = memory_timeline(lambda: torch.zeros(10))
    with pytest.raises(ValueError, match="no phase 'backward'"):
        tl.phase_peak("backward")
    with pytest.raises(ValueError, match="non-empty string"):
        with phase(""):
            pass
    with phase("outside a timeline"):  # only a profiler annotation: must not fail
        torch.zeros(3)
    with pytest.raises(ValueError, match="no memory events"):
        memory_timeline(lambda: None, "meta")
    empty = Timeline(device="cpu", method="test")
    assert empty.peak_bytes == 0 and empty.final_bytes == 0


def test_peak_bytes_and_allocated_after_on_cpu():
    def temporary():
        t = torch.ones(MiB)  # 4 MiB, gone when the function returns
        return float(t.sum())

    assert peak_bytes(temporary) >= 4 * MiB
    assert peak_bytes(lambda: None) == 0
    out, kept = allocated_after(lambda: torch.ones(MiB // 4))
    assert kept == MiB and out.numel() == MiB // 4
    out, kept = allocated_after(temporary)
    assert kept == 0 and out == MiB
    # Devices without an event source answer None rather than a made-up number.
    assert peak_bytes(lambda: None, "meta") is None
    assert allocated_after(lambda: 5, "meta") == (5, None)


def test_trace_timeline_parses_allocator_history():
    # The CUDA path's parser, on a hand-written trace (no GPU needed).
    trace = [
        {"action": "segment_alloc", "size": 4096, "time_us": 100},
        {"action": "alloc", "size": 1000, "time_us": 100},
        {"action": "alloc", "size": 500, "time_us": 150},
        {"action": "free_requested", "size": 1000, "time_us": 180},
        {"action": "free_completed", "size": 1000, "time_us": 200},
        {"action": "alloc", "size": 200, "time_us": 300},
    ]
    tl = timeline_module._trace_timeline(trace, [("forward", 0, 3), ("backward", 3, 6)], "cuda:0", "test")
    assert tl.allocated == [1000, 1500, 500, 700]
    assert tl.t_ms == [0.0, 0.05, 0.1, 0.2]
    assert tl.peak_bytes == 1500 and tl.final_bytes == 700
    assert tl.phases == [Phase("forward", 0.0, 0.05), Phase("backward", 0.08, 0.2)]


# --------------------------------------------------------------------------- one step by phase

@pytest.fixture
def one_thread():
    """CPU bytes are deterministic at a fixed number of threads (docs/method.md#memory)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("overrides", [{}, {"precision": "bf16", "checkpoint": "full"},
                                       {"grad_accum_steps": 2}],
                         ids=["fp32", "bf16-full", "accumulate-2"])
def test_step_phases_peak_equals_measures_peak(one_thread, overrides):
    """Lesson 04's phase table and measure() measure the same step the same way: the same peak,
    to the byte (issue 24: lessons 01-02 printed 109.43 MiB and lesson 04 108.41 MiB for the
    same fp32 step, one logits tensor apart)."""
    from course_utils.config import config_for
    from course_utils.hardware import detect
    from course_utils.measure import measure, prepare
    from course_utils.memory_model import estimate
    from course_utils.memory_timeline import STEP_PHASES, step_phases

    cfg = config_for("smoke", device="cpu", **overrides)
    measured = measure(cfg, timed=False)
    phases = step_phases(prepare(cfg, detect("cpu")))
    assert phases.peak_bytes == measured.peak_allocated
    assert list(phases.peaks) == list(phases.ends) == list(STEP_PHASES)
    assert max(phases.peaks.values()) == phases.peak_bytes and phases.peak_phase in STEP_PHASES
    est = estimate(cfg)
    assert phases.start_bytes == est.parameters + est.optimizer_state
    # after the optimizer step: weights, AdamW state and the gradients it used (freed later)
    assert phases.ends["optimizer step"] >= phases.start_bytes + est.gradients
    # lessons 01 and 02 measure through compare(), lesson 03's batch search and the dashboard
    # through measure(): one code path, the same bytes in every lesson (issue 24 item 3)
    from course_utils.experiments import compare
    row = compare([cfg], timed=False, progress=False).iloc[0]
    assert int(row["peak_allocated"]) == measured.peak_allocated == phases.peak_bytes
    assert int(row["saved_total"]) == measured.saved_total
    table = phases.table()
    assert list(table.columns) == ["peak MiB", "allocated at its end MiB"]
    assert table.loc["backward", "peak MiB"] * MiB == phases.peaks["backward"]


def test_step_phases_refuses_a_device_without_events():
    from types import SimpleNamespace

    from course_utils.memory_timeline import step_phases
    state = SimpleNamespace(config=SimpleNamespace(device="meta"),
                            module=torch.nn.Linear(2, 2), optimizer=SimpleNamespace(state={}))
    with pytest.raises(ValueError, match="no memory events"):
        step_phases(state)
