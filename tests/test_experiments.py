"""course_utils.experiments: the ladder a machine compares."""


from helpers import fake_cpu, fake_cuda

from course_utils import hardware
from course_utils.config import config_for
from course_utils.experiments import ladder, plain_label, round_sig, time_cell


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


def _timed(config, times):
    from course_utils.measure import Measurement
    from course_utils.memory_model import estimate
    m = Measurement(config=config, device_name="fake")
    e = estimate(config)
    for f in ("parameters", "gradients", "optimizer_state", "activations",
              "autocast_weight_copies", "logits", "peak_allocated"):
        setattr(m, f, getattr(e, f))
    m.add_times(times)
    return m


def test_summary_milliseconds_agree_with_the_ratio_beside_them():
    """Lesson 02 on a shared 2-core machine printed 164 ms and 170 ms against 137 ms beside
    "1.26x slower" and "1.25x slower": each row's own median came from a different round of a
    drifting load. The table prints the reference's median times the per-round ratio (as
    lesson 05's Profile does), so milliseconds and ratio agree and the rows keep the ratios'
    order; the own median stays in the detailed view."""
    from course_utils.experiments import _table, summary
    from course_utils.step_timing import time_ratio
    base = config_for("smoke", device="cpu")
    # three quiet rounds, then four busy ones (twice the time); row b is 1.3x slower in the
    # quiet rounds and in one busy one, row c 1.2x in the busy rounds
    ref = [0.100, 0.100, 0.100, 0.200, 0.200, 0.200, 0.200]
    b = [r * k for r, k in zip(ref, (1.30, 1.30, 1.30, 1.30, 1.12, 1.12, 1.12))]
    c = [r * k for r, k in zip(ref, (1.15, 1.15, 1.15, 1.20, 1.20, 1.20, 1.20))]
    ms = [_timed(base, ref), _timed(base.replace(checkpoint="full"), b),
          _timed(base.replace(checkpoint="selective"), c)]
    df = _table(ms, "cpu")
    ratios = [time_ratio(m.step_times_s, ref, size="cpu").ratio for m in ms]
    own = [m.step_time_s for m in ms]
    # the case the audit found: the row with the larger ratio has the smaller own median
    assert (ratios[1] - ratios[2]) * (own[1] - own[2]) < 0
    s = summary(df)
    step = [float(x.replace(",", "")) for x in s["step ms"]]
    assert step[0] == round_sig(own[0] * 1e3)
    for i in (1, 2):
        assert step[i] == round_sig(own[0] * ratios[i] * 1e3)
        assert s["time vs first"].iloc[i].startswith(f"{step[i] / step[0]:.2f}x slower (")
    assert (step[1] - step[2]) * (ratios[1] - ratios[2]) > 0   # the ratios' order
    d = summary(df, detail=True)
    assert [float(x.replace(",", "")) for x in d["own median step ms"]] == [
        round_sig(t * 1e3) for t in own]
    assert float(d["tokens/s"].iloc[1].replace(",", "")) == round_sig(
        base.tokens_per_step / (own[0] * ratios[1]))
    # a table without the column (an older history) keeps each row's own median
    old = summary(df.drop(columns="paired_step_time_s"))
    assert [float(x.replace(",", "")) for x in old["step ms"]] == [round_sig(t * 1e3) for t in own]


def test_a_korean_kernel_shows_cells_and_configurations_in_korean(monkeypatch):
    """Issue 28: a table's time cell and a configuration's words are Korean; the verdicts and
    labels code reads stay English (time_cell takes them as they are)."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    assert time_cell(1.31, "slower") == "1.31x 더 느림"
    assert time_cell(0.70, "faster") == "1.43x 더 빠름"     # a speed-up, as in English
    assert time_cell(1.02, "within noise") == "노이즈 범위 안"
    assert time_cell(31.0, "emulated") == "에뮬레이션"  # no factor: the setup cell prints it once
    assert plain_label("bf16+full+accum2") == "bf16 + 전체 체크포인팅, 마이크로배치 2개"
    assert plain_label("fp32+every-2") == "fp32 + 2블록마다 체크포인팅"
