"""course_utils.search: the largest batch under a budget (measured) and the race of a plain and a
checkpointed configuration, each at its largest batch."""
import pytest

from course_utils import search
from course_utils.config import config_for

SMOKE = config_for("smoke", device="cpu")


MiB = 2**20


def test_largest_batch_finds_the_boundary_it_measured(fp32_search):
    budget, s = fp32_search
    assert s.batch_size == 3, [(p.batch_size, p.peak_allocated, p.fits) for p in s.probes]
    probes = {p.batch_size: p for p in s.probes}
    assert probes[3].fits and probes[3].peak_allocated <= budget
    assert not probes[4].fits and probes[4].peak_allocated > budget
    assert s.measurement.config.batch_size == 3
    assert s.measurement.peak_allocated <= budget
    assert s.tokens_per_s and s.tokens_per_s > 0
    assert len(s.probes) <= 6, "estimate-guided search should need few measurements"
    assert s.method.startswith("CPU")
    row = s.as_row()
    assert row["largest batch"] == 3 and row["tokens/step"] == 3 * SMOKE.seq_len
    assert s.first_too_big == 4 and row["first batch too big"] == 4
    # the estimate curve covers batch 1 .. the largest probed + 1 and never decreases
    batches, peaks = zip(*s.estimated)
    assert batches[0] == 1 and list(peaks) == sorted(peaks)


def test_checkpointing_fits_a_larger_batch_under_the_same_budget(fp32_search):
    budget, plain = fp32_search
    ckpt = search.largest_batch(SMOKE.replace(precision="fp32", checkpoint="full"), budget)
    assert ckpt.batch_size > plain.batch_size
    assert ckpt.measurement.peak_allocated <= budget
    assert any(not p.fits for p in ckpt.probes)


def test_a_memory_only_search_times_nothing_and_finds_the_same_boundary(fp32_search):
    """steps=0 (lesson 03 on every device): one memory step per batch tried, no timed steps,
    the same answer; the measured peaks steer it there in few measurements."""
    budget, timed = fp32_search
    s = search.largest_batch(SMOKE.replace(precision="fp32"), budget, steps=0)
    assert s.batch_size == timed.batch_size and s.first_too_big == timed.first_too_big
    assert s.measurement.step_time_s is None and s.tokens_per_s is None
    assert all(p.step_time_s is None for p in s.probes)
    assert len(s.probes) <= 4


def test_the_secant_uses_the_measured_slope_unless_the_peak_is_still_flat():
    """Where the estimate over-counts bytes per sequence (bf16 with full checkpointing by up to
    17%, memory_model's docstring), stepping by the estimate's slope crept up one batch at a
    time and then fell back to doubling: 13 measurements on a T4 stand-in. The secant of the
    two measured peaks nearest the budget lands on the boundary."""
    from course_utils.search import Probe, _Search
    budget_bytes = 1000
    s = _Search(SMOKE.replace(precision="fp32"), budget_bytes, 64, 0, 1)
    s.est_slope = 12.0                                   # the estimate: 12 bytes per sequence
    s.probes = {10: Probe(10, 600, 700, True, False, None, None),
                20: Probe(20, 700, 820, True, False, None, None)}  # measured: 10 per sequence
    assert s.slope() == 10.0 and s.next_guess(20) == 50   # 700 + 30 x 10 = the budget
    s.probes = {10: Probe(10, 600, 700, True, False, None, None),
                20: Probe(20, 620, 820, True, False, None, None)}  # flat: the optimizer step
    assert s.slope() == 12.0 and s.next_guess(20) == 20 + (budget_bytes - 620) // 12


def test_largest_batch_reports_nothing_fits_and_respects_max_batch():
    cfg = SMOKE.replace(precision="fp32")
    none = search.largest_batch(cfg, 1024)  # 1 KiB: not even the parameters fit
    assert none.batch_size == 0 and none.measurement is None and none.tokens_per_s is None
    assert [p.batch_size for p in none.probes] == [1]
    capped = search.largest_batch(cfg, 2**40, max_batch=2)
    assert capped.batch_size == 2 and len(capped.probes) == 1


@pytest.mark.parametrize("bad", [
    dict(budget_bytes=0), dict(budget_bytes=-5), dict(budget_bytes=1.5e6), dict(max_batch=0),
    dict(steps=-1), dict(steps=1.5), dict(warmup=0), dict(guided_probes=0)])
def test_largest_batch_rejects_bad_arguments(bad):
    kw = dict(budget_bytes=10 * MiB) | bad
    with pytest.raises(ValueError):
        search.largest_batch(SMOKE, **kw)


def test_largest_batch_refuses_a_device_without_peak_counter():
    with pytest.raises(ValueError, match="peak-memory counter"):
        search.largest_batch(SMOKE.replace(device="mps"), 10 * MiB)


@pytest.fixture(scope="module")
def race_inputs(fp32_search):
    """fp32 and fp32 + full checkpointing searched under one budget."""
    budget, plain = fp32_search
    return budget, [plain, search.largest_batch(SMOKE.replace(checkpoint="full"), budget)]


def test_race_times_each_at_its_largest_batch_per_token(race_inputs):
    budget, searches = race_inputs
    result = search.race(searches, steps=4, progress=False)
    assert result.plain.label == "fp32" and result.checkpointed.label == "fp32+full"
    assert result.plain.batch_size == searches[0].batch_size
    assert result.checkpointed.batch_size == searches[1].batch_size > result.plain.batch_size
    ms = result.table.attrs["measurements"]
    assert [len(m.step_times_s) for m in ms] == [4, 4]  # timed in the same 4 rounds
    per_token = [m.step_time_s / m.config.tokens_per_step for m in ms]
    assert list(result.table["time_per_token_s"]) == pytest.approx(per_token)
    # the ratio pairs the rounds: median of per-round ratios of seconds per token
    a, b = ms[1], ms[0]
    rounds = sorted((ta / a.config.tokens_per_step) / (tb / b.config.tokens_per_step)
                    for ta, tb in zip(a.step_times_s, b.step_times_s))
    assert result.per_token.ratio == pytest.approx((rounds[1] + rounds[2]) / 2)
    assert result.per_token.verdict == "too small to time"  # smoke: never a verdict
    assert result.budget_bytes == budget
    described = result.describe()
    assert "time per token" in described and f"batch {result.checkpointed.batch_size}" in described
    assert described.startswith(f"fp32 + full checkpointing at micro-batch {result.checkpointed.batch_size} "
                                f"against fp32 at micro-batch {result.plain.batch_size}")
    assert "fp32+full" not in described          # the configurations in words, never the short label
    assert "cannot tell" in result.reading()     # no verdict at the smoke size, so no reading either
    from course_utils import plots
    fig = plots.race_chart(result, size="smoke")
    assert [t.get_text() for t in fig.axes[0].texts] == ["reference", "too small to time\nvs fp32"]


def test_the_race_reading_follows_the_per_token_verdict():
    """The sentence under the race says what the per-token verdict says, nothing more: the
    larger batch repaid the recompute only when the time per token is faster outside the
    noise."""
    from course_utils.step_timing import TimeRatio
    plain, ckpt = SMOKE.replace(batch_size=3), SMOKE.replace(checkpoint="full", batch_size=8)

    def reading(verdict, c=ckpt):
        return search.Race(None, plain, c, TimeRatio(0.8, 0.7, 0.9, 9, verdict), 2**20).reading()
    assert "repaid its recompute" in reading("faster")
    assert "did not repay" in reading("slower")
    assert "cannot tell" in reading("within noise") and "(within noise)" in reading("within noise")
    assert "no larger micro-batch" in reading("faster", c=ckpt.replace(batch_size=3))


def test_race_needs_a_plain_and_a_checkpointed_configuration(race_inputs):
    budget, (plain, ckpt) = race_inputs
    with pytest.raises(ValueError, match="plain and a checkpointed"):
        search.race([plain], steps=1, progress=False)
    nothing = search.BatchSearch(config=SMOKE, budget_bytes=budget, batch_size=0, measurement=None)
    with pytest.raises(ValueError, match="plain and a checkpointed"):
        search.race([nothing, ckpt], steps=1, progress=False)
    other = search.BatchSearch(config=ckpt.config, budget_bytes=budget + 1, batch_size=ckpt.batch_size,
                               measurement=ckpt.measurement)
    with pytest.raises(ValueError, match="one budget"):
        search.race([plain, other], steps=1, progress=False)


def test_a_korean_kernel_reads_the_race_in_korean(monkeypatch):
    """Issue 28: the race's sentence and its reading are Korean, with the batches, budget and
    verdict the English ones print."""
    import pandas as pd

    from course_utils.step_timing import time_ratio
    cfg = config_for("smoke", device="cpu")
    per_token = time_ratio([0.8, 0.82, 0.79, 0.81, 0.8, 0.8], [1.0] * 6, size="cpu")
    race = search.Race(pd.DataFrame(), cfg.replace(batch_size=4),
                       cfg.replace(checkpoint="full", batch_size=12), per_token, 64 * 2**20)
    monkeypatch.setenv("COURSE_LANG", "ko")
    assert race.describe().startswith("마이크로배치 12의 fp32 + 전체 체크포인팅 대 마이크로배치 4의 "
                                      "fp32, 둘 다 64.0 MiB 안: 토큰당 시간 1.25x 더 빠름")
    assert race.reading().startswith("여기서는 체크포인팅 덕분에 들어간 더 큰 배치가")
