"""Largest batch under a budget (course_utils.search, measured), peak of any step, memory at
scale (course_utils.memory_model, estimates), committed results (course_utils.results). At the
`smoke` size (seconds); no GPU needed."""
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from course_utils import memory_model, results, search
from course_utils.config import ModelShape, RunConfig, config_for
from course_utils.measure import measure
from course_utils.memory_model import estimate, parameter_count
from course_utils.timeline import peak_during

SMOKE = config_for("smoke", device="cpu")
MiB = 2**20


def peak_at(config, batch):
    return measure(config.replace(batch_size=batch), timed=False).peak_allocated


@pytest.fixture(scope="module")
def fp32_search():
    """fp32's largest batch under the peak fp32 itself measured at batch 3."""
    cfg = SMOKE.replace(precision="fp32")
    budget = peak_at(cfg, 3)
    return budget, search.largest_batch(cfg, budget)


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
    # the estimate curve covers batch 1 .. the largest probed + 1 and never decreases
    batches, peaks = zip(*s.estimated)
    assert batches[0] == 1 and list(peaks) == sorted(peaks)


def test_checkpointing_fits_a_larger_batch_under_the_same_budget(fp32_search):
    budget, plain = fp32_search
    ckpt = search.largest_batch(SMOKE.replace(precision="fp32", checkpoint="full"), budget)
    assert ckpt.batch_size > plain.batch_size
    assert ckpt.measurement.peak_allocated <= budget
    assert any(not p.fits for p in ckpt.probes)


def test_largest_batch_reports_nothing_fits_and_respects_max_batch():
    cfg = SMOKE.replace(precision="fp32")
    none = search.largest_batch(cfg, 1024)  # 1 KiB: not even the parameters fit
    assert none.batch_size == 0 and none.measurement is None and none.tokens_per_s is None
    assert [p.batch_size for p in none.probes] == [1]
    capped = search.largest_batch(cfg, 2**40, max_batch=2)
    assert capped.batch_size == 2 and len(capped.probes) == 1


@pytest.mark.parametrize("bad", [
    dict(budget_bytes=0), dict(budget_bytes=-5), dict(budget_bytes=1.5e6), dict(max_batch=0),
    dict(steps=0), dict(warmup=0), dict(guided_probes=0)])
def test_largest_batch_rejects_bad_arguments(bad):
    kw = dict(budget_bytes=10 * MiB) | bad
    with pytest.raises(ValueError):
        search.largest_batch(SMOKE, **kw)


def test_largest_batch_refuses_a_device_without_peak_counter():
    with pytest.raises(ValueError, match="peak-memory counter"):
        search.largest_batch(SMOKE.replace(device="mps"), 10 * MiB)


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


def test_scale_estimate_takes_the_same_type_as_the_course_model():
    """estimate() reads a RunConfig whatever its ModelShape: the course model's or 7B's."""
    cfg = SMOKE.replace(n_layers=4, checkpoint="full", precision="bf16")
    same = memory_model.scale_config(cfg.shape, cfg.batch_size, "bf16", "full")
    assert estimate(same).as_row() == estimate(cfg.replace(device="cuda")).as_row()
    assert cfg.shape.n_parameters == parameter_count(cfg)
    seven = memory_model.scale_config("7B", batch_size=2, checkpoint="full")
    assert isinstance(seven, RunConfig) and seven.vocab_size == 32000 and seven.batch_size == 2
    with pytest.raises(ValueError, match="unknown model"):
        memory_model.scale_config("13B")


def test_scale_models_have_their_names_parameter_counts():
    for name, target in (("1B", 1e9), ("7B", 7e9), ("70B", 70e9)):
        n = memory_model.SCALE_MODELS[name].n_parameters
        assert 0.9 * target < n < 1.1 * target, (name, n)


def test_scale_table_16_bytes_per_parameter_and_checkpointing_shrinks_activations():
    t = memory_model.scale_table(detail=True)
    assert len(t) == len(memory_model.SCALE_MODELS) * len(memory_model.SCALE_RECIPES)
    assert ((t["bytes/param"] - 16).abs() < 1e-3).all()  # 4 weights + 4 grads + 8 AdamW
    seven = t[t["model"] == "7B"].set_index("recipe")
    n = memory_model.SCALE_MODELS["7B"].n_parameters
    assert seven.loc["fp32", "weights"] == pytest.approx(4 * n / 2**30)
    assert seven.loc["fp32", "AdamW state"] == pytest.approx(8 * n / 2**30, rel=1e-6)
    assert seven.loc["fp32", "weight copies"] == 0
    assert seven.loc["bf16 autocast", "weight copies"] > 0
    ckpt = seven.loc["bf16 autocast + full ckpt", "activations"]
    assert ckpt < 0.2 * seven.loc["bf16 autocast", "activations"]
    # a larger micro-batch raises activations, not the 16 bytes/param
    t8 = memory_model.scale_table(batch_size=8, detail=True)
    assert (t8["activations"] > t["activations"]).all()
    assert (t8["weights"] == t["weights"]).all()


@pytest.mark.parametrize("bad", [dict(n_layers=0), dict(d_model=100, n_heads=3),
                                 dict(attention="flash"), dict(vocab_size=0)])
def test_model_shape_rejects_invalid_fields(bad):
    kw = dict(n_layers=2, d_model=64, n_heads=2) | bad
    with pytest.raises(ValueError):
        ModelShape(**kw)
    with pytest.raises(ValueError):
        memory_model.scale_table(models={})
    with pytest.raises(ValueError):
        memory_model.scale_config("7B", precision="fp8")


def test_committed_results_reads_course_bench_output(tmp_path):
    from course_utils.cli import main
    assert results.committed_results(tmp_path).empty
    assert list(results.committed_results(tmp_path).columns)[:4] == ["run", "device", "size",
                                                                    "config"]
    out = tmp_path / "Some-GPU-2026-01-01"
    assert main(["--size", "smoke", "--device", "cpu", "--precisions", "fp32",
                 "--steps", "1", "--out", str(out)]) == 0
    assert results.committed_results(tmp_path).empty          # a CPU run: not among the GPU runs
    df = results.committed_results(tmp_path, devices=("cpu",))
    assert list(df["run"]) == ["Some-GPU-2026-01-01"] and list(df["config"]) == ["fp32"]
    assert df["peak MiB"].iloc[0] > 0 and df["time x"].iloc[0] == pytest.approx(1.0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bench.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="broken"):
        results.committed_results(tmp_path, devices=None)
    assert isinstance(df, pd.DataFrame)


TRANSCRIPT = """--- [setup]
device        : cuda (Some GPU 80GB)
torch         : 2.11.0+cu130

--- [cuda-memory-tools]
| Allocated memory      |   3997 MiB |  15524 MiB |  86928 MiB |  82931 MiB |
                                                        MiB
peak allocated in the step (max_memory_allocated)   15524.6
estimated peak (memory_model.estimate)              15580.5
reserved now (memory_reserved)                      16180.0
of which split blocks (fragmentation)                1082.7
used outside PyTorch's allocator: CUDA context,...    766.8
memory snapshot: /tmp/x/memory_snapshot.pickle (0.7 MiB).
--- [phase-timeline]
peak allocated in the step (max_memory_allocated)   1.0
"""


def test_committed_memory_tools_reads_lesson_04s_gpu_transcript(tmp_path):
    """Lesson 04's memory-tools cell, on a machine without a GPU, quotes the committed GPU run
    in one line: the four numbers of that cell's table, read from its section alone."""
    assert results.committed_memory_tools(tmp_path) is None
    folder = tmp_path / "lesson-timings-Some-GPU-2026-01-01" / "transcripts"
    folder.mkdir(parents=True)
    (folder / "04_scaling_out.txt").write_text(TRANSCRIPT.replace("--- [cuda-memory-tools]", "--- [other]"))
    assert results.committed_memory_tools(tmp_path) is None     # no table: nothing to quote
    (folder / "04_scaling_out.txt").write_text(TRANSCRIPT)
    got = results.committed_memory_tools(tmp_path)
    assert got == {"run": "lesson-timings-Some-GPU-2026-01-01", "device": "Some GPU 80GB",
                   "torch": "2.11.0+cu130", "peak_allocated": 15524.6, "reserved": 16180.0,
                   "split_blocks": 1082.7, "outside_allocator": 766.8}
    committed = results.committed_memory_tools()               # the run committed with the course
    assert committed is None or committed["reserved"] >= committed["peak_allocated"] > 0


def test_results_are_found_beside_the_imported_course_not_from_the_working_folder(tmp_path,
                                                                                 monkeypatch):
    """On Colab the working folder is /content and the course is a clone inside it: the results
    committed with the course are the clone's."""
    course = Path(results.__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)                                    # Colab's /content
    assert results.find_results() == course / "results"
    stray = tmp_path / "work"
    (stray / "results").mkdir(parents=True)                        # not a copy of the course
    assert results.find_results(stray) == course / "results"
    monkeypatch.setattr(results, "_COURSE_ROOT", tmp_path / "site-packages")   # a wheel install
    assert results.find_results(stray) is None
    (stray / "course_utils").mkdir()
    assert results.find_results(stray / "notebooks") == stray / "results"


def test_lesson03_charts_draw_what_they_are_given(fp32_search):
    """The charts of lesson 03 (course_utils.plots): real inputs in, the right panels out."""
    from course_utils import plots
    from course_utils.claims import Verdict, claims_table

    budget, s = fp32_search
    fig = plots.budget_chart([s])
    (ax,) = fig.axes                    # memory only: the search's single steps are not a throughput
    assert [line.get_ydata()[0] for line in ax.lines if line.get_color() == "#B71C1C"] == \
        [pytest.approx(budget / MiB)]
    assert len(ax.collections) == len([p for p in s.probes if p.peak_allocated is not None])
    with pytest.raises(ValueError):
        plots.budget_chart([])

    table = memory_model.scale_table()
    fig = plots.scale_chart(table, gpus={"24 GiB": 24})
    assert len(fig.axes) == len(memory_model.SCALE_MODELS)
    assert fig.axes[0].get_xlim()[1] > 24  # the 1B panel reaches the 24 GiB line

    story = pd.DataFrame({"step": ["a", "b", "c"], "step_time_s": [0.2, 0.1, float("nan")],
                          "peak_allocated": [100 * MiB, 80 * MiB, 40 * MiB],
                          "source": ["measured", "measured", "estimate"]})
    fig = plots.adoption_chart(story)
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert "0.80x" in texts and any("0.50x" in t and "estimate" in t for t in texts)
    assert any("not measured" in t.get_text() for t in fig.axes[0].texts)

    ledger = claims_table([Verdict("C2", "busted", "peak 0.8x <fp32>", "[03 §1](#1.-The-ladder)"),
                           Verdict("C1", "not measured here", "no GPU", "01")])
    html = plots.styled_claims(ledger).to_html()
    assert '<a href="#1.-The-ladder">03 §1</a>' in html
    assert "&lt;fp32&gt;" in html  # evidence text is escaped, links are not
    assert "#FFCDD2" in html  # failed red


# ----------------------------------------------------------------- the race at the largest batches

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
    assert result.per_token.verdict == "inconclusive at this size"  # smoke: never a verdict
    assert result.budget_bytes == budget
    described = result.describe()
    assert "time per token" in described and f"batch {result.checkpointed.batch_size}" in described
    assert described.startswith(f"fp32 + full checkpointing at micro-batch {result.checkpointed.batch_size} "
                                f"against fp32 at micro-batch {result.plain.batch_size}")
    assert "fp32+full" not in described          # the configurations in words, never the short label
    assert "cannot tell" in result.reading()     # no verdict at the smoke size, so no reading either
    from course_utils import plots
    fig = plots.race_chart(result, size="smoke")
    assert [t.get_text() for t in fig.axes[0].texts] == ["reference", "inconclusive"]


def test_the_race_reading_follows_the_per_token_verdict():
    """The sentence under the race says what the per-token verdict says, nothing more: the
    larger batch repaid the recompute only when the time per token is faster outside the
    noise."""
    from course_utils.timing import TimeRatio
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
