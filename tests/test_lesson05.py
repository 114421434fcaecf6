"""Lesson 05 and exercise 05: the notebook's own code is the library's rule, the notebook keeps the
course's shape, and exercise 05's solution holds beyond the graded shapes.

The functions are taken from the notebooks' cells (`ast`), so a change to a cell is tested here.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from course_utils import model_zoo
from course_utils.checkpointing import SAVE
from course_utils.profiling import find_blocks, wrap_blocks
from course_utils.saved_tensors import saved_bytes

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "05_your_model.ipynb"
SOLUTION = ROOT / "solutions" / "05_llama_block.ipynb"


def _cells(path: Path) -> dict:
    nb = json.loads(path.read_text())
    return {c["id"]: "".join(c["source"]) for c in nb["cells"]}


def _definitions(source: str, names, namespace: dict) -> dict:
    """Execute the top-level definitions ``names`` (functions, classes) of a cell's source."""
    tree = ast.parse(source)
    keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    assert {n.name for n in keep} == set(names), f"cell lost one of {names}"
    exec(compile(ast.Module(keep, []), "<cell>", "exec"), namespace)
    return namespace


def test_lesson_starts_with_objectives_and_ends_with_what_next():
    nb = json.loads(LESSON.read_text())
    first = "".join(nb["cells"][0]["source"]).lower()
    last = "".join(nb["cells"][-1]["source"])
    assert "learning objectives" in first
    assert "## Summary" in last and "## What to try next" in last


def test_the_lessons_block_finder_is_the_librarys_rule():
    ns = _definitions(_cells(LESSON)["find"], ["repeated_blocks"], {"nn": nn})
    zoo = [model_zoo.course_gpt("smoke"), model_zoo.small_cnn(channels=8, n_blocks=2, image=8)]
    try:
        import transformers  # noqa: F401 - the [hf] extra: make test installs it
        zoo += [model_zoo.hf_causal_lm(t, n_layers=2, d_model=32, n_heads=2, seq_len=16)
                for t in ("gpt2", "llama")]
    except ImportError:
        pass
    for z in zoo:
        model = z.build()
        assert ns["repeated_blocks"](model)[0] == find_blocks(model)[0], z.name
    with pytest.raises(ValueError, match="no repeated blocks"):
        ns["repeated_blocks"](nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def test_the_lessons_wrapper_keeps_what_the_librarys_keeps():
    ns = _definitions(_cells(LESSON)["find"], ["repeated_blocks"], {"nn": nn})
    ns = _definitions(_cells(LESSON)["wrap"], ["Checkpointed", "checkpoint_every_block"],
                      {**ns, "checkpoint": torch.utils.checkpoint.checkpoint})
    z = model_zoo.course_gpt("smoke")
    x, y = z.make_batch(2)

    def loss(model):
        return model(x, y)[1]

    mine, library = ns["checkpoint_every_block"](z.build()), wrap_blocks(z.build(), "full")
    assert saved_bytes(loss, mine, model=mine) == saved_bytes(loss, library, model=library)


def test_exercise05_solution_holds_at_other_shapes():
    cells = _cells(SOLUTION)
    ns = {"torch": torch, "nn": nn, "F": torch.nn.functional, "__name__": "block"}
    exec(compile(cells["block"].split("\n\ntorch.manual_seed(0)")[0], "<block>", "exec"), ns)
    _definitions(cells["q3-solution"], ["predict_saved_bytes"], ns)
    for shape in ((1, 8, 16, 2, 48, 8), (4, 32, 64, 4, 192, 40), (2, 96, 48, 3, 160, 96)):
        batch, seq, d, h, hidden, max_seq = shape
        torch.manual_seed(0)
        block = ns["LlamaBlock"](d, h, hidden, max_seq)
        x = torch.randn(batch, seq, d, requires_grad=True)
        measured = saved_bytes(block, x, model=block)
        assert abs(ns["predict_saved_bytes"](*shape) / measured - 1) <= 0.05, shape


def test_exercise05_policy_keeps_the_librarys_save_list():
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext
    ns = {"torch": torch, "CheckpointPolicy": CheckpointPolicy}
    src = _cells(SOLUTION)["q2-solution"]
    exec(compile(src, "<q2>", "exec"), ns)
    ctx = SelectiveCheckpointContext(is_recompute=False)
    for op in SAVE:  # the course's save list (matmuls and every attention kernel)
        assert ns["matmul_policy"](ctx, op) == CheckpointPolicy.MUST_SAVE, op


def _run(cell: str, namespace: dict) -> str:
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_cells(LESSON)[cell], cell, "exec"), namespace)
    return out.getvalue()


def test_the_cpu_card_budget_leaves_no_checkpointing_out():
    # a budget every policy met (full's peak at 4x the batch) made the card pick 'none' on every
    # CPU run; halfway between full's and none's peaks at the measured batch, none cannot fit
    from types import SimpleNamespace
    peaks = {"none": lambda b: 30 + 5 * b, "full": lambda b: 30 + 2 * b}
    ex = SimpleNamespace(peak=lambda b, policy: peaks[policy](b))
    seen = {}

    def recommend(prof, exs, budget, **kw):
        seen.update(budget=budget, **kw)
        return SimpleNamespace(text=lambda: "card", options_table=lambda: None)
    ns = {"hw": SimpleNamespace(device="cpu"), "ex": ex, "B": 4, "PRECISION": "fp32",
          "prof": None, "recommend": recommend, "device": "cpu"}
    _run("card", ns)
    assert ex.peak(4, "full") < seen["budget"] < ex.peak(4, "none")
    assert "halfway" in seen["budget_source"]


def test_lesson05_measures_the_course_gpt_in_this_machines_precision():
    src = _cells(LESSON)["estimate-gpt"]
    tree = ast.parse(src)
    calls = {n.func.id: n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id in ("extrapolate", "estimate")}
    assert any(k.arg == "precision" for k in calls["extrapolate"].keywords)
    replace = next(n for n in ast.walk(calls["estimate"]) if isinstance(n, ast.Call)
                   and getattr(n.func, "attr", "") == "replace")
    assert "precision" in {k.arg for k in replace.keywords}


def test_ladder_read_names_the_method_profile_called():
    transformers = pytest.importorskip("transformers")
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    import pandas as pd
    from test_profiling import synthetic_profile
    prof = synthetic_profile({"none": [1.0] * 6, "full": [1.3] * 6, "hf": [1.3] * 6})
    for m in prof.measurements:
        m.saved_modules = pd.DataFrame({"module": ["layers.0.x", "head"], "nbytes": [2**20, 2**10]})
    out = _run("ladder-read", {"prof": prof, "PRECISION": "fp32", "MiB": 2**20,
                               "transformers": transformers, "display": lambda *a: None})
    called = ("activation_checkpointing_enable()"
              if hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable")
              else "gradient_checkpointing_enable()")
    assert f"Hugging Face's own {called} keeps" in out
    assert "bit-for-bit equal" in out
