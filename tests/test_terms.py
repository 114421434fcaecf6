"""course_utils.terms: the course's words as code (precisions and their dtypes, device kinds, units,
the positive-integer check) and the one table every other module reads them from."""
import pytest
import torch

from course_utils import formats, hardware, terms
from course_utils.config import config_for
from course_utils.profiling import ProfileConfig
from course_utils.terms import (
    PRECISION_DTYPES,
    PRECISIONS,
    GiB,
    MiB,
    autocast_dtype,
    check_positive_int,
    cuda_index,
    device_kind,
    precision_dtype,
    short_dtype,
)


def test_each_precision_has_one_dtype_and_autocast_takes_the_low_ones():
    assert PRECISIONS == tuple(PRECISION_DTYPES) == ("fp32", "bf16", "fp16")
    assert [precision_dtype(p) for p in PRECISIONS] == [torch.float32, torch.bfloat16, torch.float16]
    assert [autocast_dtype(p) for p in PRECISIONS] == [None, torch.bfloat16, torch.float16]
    assert [short_dtype(precision_dtype(p)) for p in PRECISIONS] == list(PRECISIONS)
    assert short_dtype(torch.int64) == "int64" and short_dtype(torch.complex64) == "complex64"
    for bad in ("fp8", "float16", None):
        with pytest.raises(ValueError, match="expected one of fp32, bf16, fp16"):
            precision_dtype(bad)


def test_the_other_modules_read_the_one_table():
    """formats' number formats and the matmul probe take their dtypes from PRECISION_DTYPES; a
    config and a profile's row mean the same autocast by the same precision name."""
    for p in PRECISIONS:
        assert formats.FORMATS[p] is PRECISION_DTYPES[p]
        run, row = config_for("smoke", device="cpu", precision=p), ProfileConfig("m", p)
        assert run.dtype is row.dtype is autocast_dtype(p)
        assert run.device_type == row.device_type == "cpu"
        with run.autocast():
            assert torch.is_autocast_enabled("cpu") is (p != "fp32")
    assert list(hardware.matmul_probe("cpu", n=8, budget_s=0.001)) == list(PRECISIONS)


def test_devices_and_units():
    assert device_kind("cuda:1") == "cuda" and device_kind(torch.device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        device_kind("gpu")
    with pytest.raises(ValueError, match="not a CUDA device"):
        cuda_index("cpu")
    assert cuda_index("cuda:3") == 3
    assert (MiB, GiB) == (2**20, 2**30) and terms.DEVICE_KINDS == ("cpu", "cuda", "mps")


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3", None])
def test_a_count_is_a_positive_integer_and_never_a_bool(value):
    with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {value!r}"):
        check_positive_int("batch_size", value)


def test_the_count_check_takes_a_minimum_and_none_where_allowed():
    check_positive_int("steps", 1)
    check_positive_int("steps", None, allow_none=True)
    check_positive_int("n_tensors", 0, minimum=0)
    with pytest.raises(ValueError, match=r"k must be an integer >= 2, got 1\."):
        check_positive_int("k", 1, minimum=2)
    with pytest.raises(ValueError, match="must be a positive integer or None, got 0"):
        check_positive_int("steps", 0, allow_none=True)


def test_a_korean_learner_reads_the_count_check_and_a_bad_config_in_korean(monkeypatch):
    """Issue 28: the messages a learner meets on bad input come in the learner's language, the
    value and the valid names as they are; English stays the default (the tests above)."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    with pytest.raises(ValueError) as info:
        check_positive_int("steps", 0)
    assert str(info.value) == "steps은(는) 양의 정수여야 합니다. 받은 값: 0."
    with pytest.raises(ValueError) as info:
        check_positive_int("k", 1, minimum=2, allow_none=True)
    assert str(info.value) == "k은(는) 2 이상의 정수이거나 None이어야 합니다. 받은 값: 1."
    with pytest.raises(ValueError) as info:
        config_for("huge")
    assert str(info.value) == ("알 수 없는 크기 'huge'입니다. 다음 중 하나여야 합니다: "
                               "smoke, cpu, t4, a100, h100.")
    with pytest.raises(ValueError, match=r"^알 수 없는 정밀도 'fp8'"):
        precision_dtype("fp8")
