"""course_utils.chunked_loss: the chunked cross-entropy gives the plain loss and gradients at
large vocabularies, in fp32 and under bf16 autocast, never holds the full logits, and allocates
the bytes `chunked_loss_bytes` states (issue 26 item 2). The vocabularies are real ones (Llama 2's
32,000 and Llama 3's 128,256, rounded up to powers of two, and Gemma's 256,000 likewise) on a
tiny batch: the vocabulary is the point, the rest is kept small so that each test takes seconds."""
import pytest
import torch
import torch.nn.functional as F

from course_utils.chunked_loss import IGNORE_INDEX, chunked_cross_entropy, chunked_loss_bytes
from course_utils.config import RunConfig, config_for
from course_utils.data import get_batch
from course_utils.memory_timeline import peak_during
from course_utils.models import GPT, build_model
from course_utils.saved_tensors import SavedTensorMeter

VOCABS = (32_768, 131_072, 262_144)
B, T, D, CHUNK = 2, 12, 16, 7          # 24 tokens in chunks of 7: the last chunk is shorter
N = B * T

#: How close the chunked loss must come to the plain one, as ||chunked - plain|| / ||plain||.
#: fp32: both sum the same terms in other orders, sums of up to 2^18 vocabulary entries, about
#: sqrt(V) roundings of 2^-24 each (< 3e-5): 1e-4. bf16 autocast: both start from the same bf16
#: logits and do the softmax in fp32; the weight gradient is rounded to bf16 once per chunk
#: before its fp32 sum (the plain loss rounds it once): bf16's unit roundoff, 2^-8. The loss
#: itself is fp32 arithmetic on the same logits in both: 1e-5.
GRAD_RTOL = {"fp32": 1e-4, "bf16": 2.0 ** -8}
LOSS_RTOL = 1e-5

#: What the stated bytes leave out: a few vectors of one number per token (the mask of counted
#: tokens, the targets made safe to index, the per-token scale) and of one per chunk row.
PER_TOKEN_SLACK = 32


def _inputs(V: int, bias: bool = False):
    g = torch.Generator().manual_seed(V)
    hidden = torch.randn(B, T, D, generator=g)
    weight = torch.randn(V, D, generator=g) * 0.2
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, 3] = IGNORE_INDEX
    return hidden, weight, targets, (torch.randn(V, generator=g) if bias else None)


def _plain(h, w, t, b=None):
    return F.cross_entropy(F.linear(h, w, b).flatten(0, 1), t.flatten())


def _chunked(h, w, t, b=None):
    return chunked_cross_entropy(h, w, t, CHUNK, bias=b)


def _run(loss_fn, hidden, weight, targets, bias, precision):
    """Loss and gradients of ``loss_fn`` under ``precision``'s autocast."""
    leaves = [x.clone().requires_grad_() for x in (hidden, weight) + ((bias,) if bias is not None
                                                                     else ())]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = loss_fn(leaves[0], leaves[1], targets, *leaves[2:])
    loss.backward()
    return loss.detach(), [x.grad for x in leaves]


def _rel(got, want) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("V", VOCABS)
def test_loss_and_gradients_equal_the_plain_ones(V, precision):
    inputs = _inputs(V)
    want_loss, want = _run(_plain, *inputs, precision)
    got_loss, got = _run(_chunked, *inputs, precision)
    assert got_loss.dtype == want_loss.dtype == torch.float32  # the loss is fp32, as autocast's
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=LOSS_RTOL)
    for name, g, w in zip(("hidden", "head weight"), got, want):
        assert g.dtype == w.dtype == torch.float32, name
        err = _rel(g, w)
        print(f"V={V:,} {precision} d loss/d {name}: relative error {err:.1e} "
              f"(tolerance {GRAD_RTOL[precision]:.1e})")
        assert err <= GRAD_RTOL[precision], (name, err)
    assert torch.count_nonzero(got[0][0, 3]) == 0  # the ignored token gets no gradient


def test_a_head_bias_gets_its_gradient_and_one_chunk_is_the_plain_loss():
    inputs = _inputs(VOCABS[0], bias=True)
    want_loss, want = _run(_plain, *inputs, "fp32")
    got_loss, got = _run(_chunked, *inputs, "fp32")
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=LOSS_RTOL)
    assert all(_rel(g, w) <= GRAD_RTOL["fp32"] for g, w in zip(got, want))
    one = _run(lambda h, w, t, b: chunked_cross_entropy(h, w, t, 10 * N, bias=b), *inputs, "fp32")
    assert one[0].item() == pytest.approx(want_loss.item(), rel=LOSS_RTOL)


def test_every_token_ignored_gives_nan_as_f_cross_entropy():
    hidden, weight, targets, _ = _inputs(VOCABS[0])
    targets = torch.full_like(targets, IGNORE_INDEX)
    assert torch.isnan(_plain(hidden, weight, targets))
    assert torch.isnan(chunked_cross_entropy(hidden, weight, targets, CHUNK))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("V", VOCABS)
def test_saved_bytes_and_peaks_are_the_stated_ones(V, precision):
    """The course's meters read what `chunked_loss_bytes` states: saved, the 4-byte log-sum-exp
    per token instead of the plain loss's ``4 V`` bytes of fp32 log-softmax; the peaks of forward
    and of backward, one chunk's logits instead of all of them."""
    a = 4 if precision == "fp32" else 2
    hidden, weight, targets, _ = _inputs(V)
    head = torch.nn.Linear(D, V, bias=False)          # the meter leaves its parameter out
    head.weight.data.copy_(weight)
    h = hidden.requires_grad_()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a == 2)
    stated = chunked_loss_bytes(N, D, V, CHUNK, a)

    saved = {}
    for name, fn in (("plain", _plain), ("chunked", _chunked)):
        with SavedTensorMeter(head) as meter, autocast:
            loss = fn(h, head.weight, targets)
        saved[name] = sum(meter.totals().values())    # (the model's buckets: test_memory_model)
        del loss
    copies = V * D * a if a == 2 else 0               # autocast's copy of the head's weight
    # both keep the head's input (cast under autocast), the weight's copy and the targets ...
    assert saved["chunked"] == N * D * a + copies + 8 * N + stated["saved"]
    # ... and the plain loss its fp32 log-softmax (4 V per token) and a scalar
    assert saved["plain"] - saved["chunked"] == 4 * N * V + 4 - stated["saved"]

    def forward():
        with autocast:
            return chunked_cross_entropy(h, head.weight, targets, CHUNK)
    fwd_peak, loss = peak_during(forward, "cpu")
    kept = N * D * a + copies if a == 2 else 0        # the low-precision casts forward keeps
    bwd_peak, _ = peak_during(loss.backward, "cpu")
    print(f"V={V:,} {precision}: forward peak {fwd_peak:,} B (stated "
          f"{kept + stated['saved'] + stated['forward']:,}), backward {bwd_peak:,} B (stated "
          f"{stated['backward']:,})")
    assert abs(fwd_peak - (kept + stated["saved"] + stated["forward"])) <= PER_TOKEN_SLACK * N
    assert abs(bwd_peak - stated["backward"]) <= PER_TOKEN_SLACK * N
    assert stated["backward"] < N * V * (a + 8)        # the plain loss's logits gradients


def test_the_course_model_chunked_gives_the_plain_loss_and_gradients():
    cfg = config_for("smoke", device="cpu", n_layers=1, vocab_size=VOCABS[0])
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    results = []
    for chunk in (0, 16):
        model = build_model(cfg.replace(loss_chunk=chunk))
        logits, loss = model(x, y)
        loss.backward()
        results.append((logits, loss.item(), [p.grad for p in model.parameters()]))
    (plain_logits, plain_loss, plain_grads), (none, loss, grads) = results
    assert plain_logits.shape == (cfg.batch_size, cfg.seq_len, VOCABS[0])
    assert none is None                                # no full logits: that is the point
    assert loss == pytest.approx(plain_loss, rel=LOSS_RTOL)
    assert max(_rel(g, w) for g, w in zip(grads, plain_grads)) <= GRAD_RTOL["fp32"]
    model = build_model(cfg.replace(loss_chunk=16))
    assert model(x)[0].shape == plain_logits.shape    # without targets: the logits, no loss


def test_bad_input_is_refused_with_a_clear_error():
    hidden, weight, targets, _ = _inputs(VOCABS[0])
    for chunk in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_tokens"):
            chunked_cross_entropy(hidden, weight, targets, chunk)
    bad = targets.clone()
    bad[1, 1] = VOCABS[0]
    cases = [((hidden[0, 0], weight, targets), "hidden must be"),
             ((hidden, weight[:, :8], targets), "weight must be"),
             ((hidden, weight, targets[:, :5]), "targets must have shape"),
             ((hidden, weight, targets.int()), "int64"),
             ((hidden, weight, bad), f"target {VOCABS[0]} is outside"),
             ((hidden, weight.double(), targets), "autocast")]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            chunked_cross_entropy(*args, CHUNK)
    with pytest.raises(ValueError, match="bias must be"):
        chunked_cross_entropy(hidden, weight, targets, CHUNK, bias=torch.zeros(3))
    for kw in ({"loss_chunk": -1}, {"loss_chunk": 1.5}):
        with pytest.raises(ValueError, match="loss_chunk"):
            config_for("smoke", **kw)
    with pytest.raises(ValueError, match="loss_chunk"):
        GPT(config_for("smoke").shape, loss_chunk=-2)
    with pytest.raises(ValueError, match="elem_bytes"):
        chunked_loss_bytes(N, D, VOCABS[0], CHUNK, 3)


def test_the_label_names_the_chunked_loss():
    cfg = config_for("smoke", precision="bf16", checkpoint="full", loss_chunk=1024)
    assert cfg.label == "bf16+full+loss-chunk:1024"
    assert isinstance(cfg, RunConfig) and cfg.replace(loss_chunk=0).label == "bf16+full"
