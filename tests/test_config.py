"""course_utils.config: RunConfig and ModelShape validation, size profiles, labels."""
import pytest

from course_utils import config as cfgmod
from course_utils import memory_model
from course_utils.config import ModelShape, RunConfig, config_for, size_profile


@pytest.mark.parametrize("kw,match", [
    ({"precision": "fp8"}, "unknown precision"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"seq_len": -1}, "seq_len"),
    ({"seq_len": 0}, "seq_len must be a positive integer"),
    ({"d_model": 100, "n_heads": 3}, "divisible"),
    ({"checkpoint": "sometimes"}, "unknown policy"),
    ({"checkpoint": "every-9", "n_layers": 4}, "outside 1..4"),
    ({"checkpoint": "segments:0"}, "outside"),
    ({"checkpoint": "memory-budget:1.5"}, "outside 0..1"),
    ({"attention": "flash3"}, "unknown attention"),
    ({"device": "tpu"}, "unknown device"),
    ({"grad_accum_steps": 0}, "grad_accum_steps"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        config_for("smoke", **kw)


def test_policy_error_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        config_for("smoke", checkpoint="half")
    for name in ("none", "full", "every-K", "segments:N", "selective", "memory-budget:B"):
        assert name in str(e.value)


def test_shape_inside_config():
    c = config_for("smoke", n_layers=3)
    assert isinstance(c.shape, ModelShape) and c.n_layers == c.shape.n_layers == 3
    d = c.replace(d_model=128, batch_size=2)
    assert (d.d_model, d.batch_size, d.shape.d_model, c.d_model) == (128, 2, 128, 64)
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        c.replace(layers=3)
    with pytest.raises(ValueError, match="ModelShape"):
        RunConfig(shape={"n_layers": 2})
    assert c.as_dict()["n_layers"] == 3 and "shape" not in c.as_dict()


def test_size_profile_env_override(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "cpu")
    assert size_profile() == "cpu"
    assert config_for().d_model == cfgmod.SIZE_PROFILES["cpu"]["d_model"]
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(ValueError, match="COURSE_SIZE"):
        size_profile()
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        config_for("smoke", layers=3)


def test_label_and_tokens():
    c = config_for("smoke", precision="bf16", checkpoint="full", grad_accum_steps=2, batch_size=3,
                   seq_len=5)
    assert c.label == "bf16+full+accum2"
    assert c.tokens_per_step == 30


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
