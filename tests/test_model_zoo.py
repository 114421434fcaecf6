"""course_utils.model_zoo: lesson 05's models, each a builder and a batch maker that profile()
takes; transformers is optional and its absence says how to install it."""
import sys

import pytest
import torch

from course_utils import model_zoo


def test_the_course_gpt_and_the_cnn_build_and_make_batches():
    gpt = model_zoo.course_gpt("smoke")
    x, y = gpt.make_batch(3)
    assert x.shape == y.shape == (3, 32) and "course GPT (2L-64d)" == gpt.name
    assert gpt.build()(x, y)[1].ndim == 0
    cnn = model_zoo.small_cnn(channels=8, n_blocks=2, image=8)
    images, labels = cnn.make_batch(2)
    out = cnn.forward(cnn.build(), (images, labels))
    assert out.shape == (2, 10) and labels.dtype == torch.long
    assert cnn.kwargs()["name"] == cnn.name


def test_without_transformers_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match=r"pip install -e '\.\[hf\]'"):
        model_zoo.require_transformers()
    with pytest.raises(ImportError, match="transformers"):
        model_zoo.hf_causal_lm("gpt2")
