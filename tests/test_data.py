"""course_utils.data: real text (Python's documentation topics), deterministic batches."""
import pytest
import torch

from course_utils.data import corpus_bytes, get_batch


def test_data_is_real_text_and_deterministic():
    text = corpus_bytes()
    assert len(text) > 300_000 and b"the" in text
    x1, y1 = get_batch(4, 16, seed=3, step=5)
    x2, y2 = get_batch(4, 16, seed=3, step=5)
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(x1, get_batch(4, 16, seed=3, step=6)[0])
    xv, _ = get_batch(4, 16, split="val")
    assert xv.dtype == torch.int64 and xv.shape == (4, 16)
    with pytest.raises(ValueError):
        get_batch(0, 16)
    with pytest.raises(ValueError):
        get_batch(2, 16, split="test")
