"""course_utils.checkpointing: every policy gives the same loss and gradients, wraps blocks and
keeps the forward a plain loop; the library's segment rule, selective policy and memory-budget
mode; and the PyTorch / Hugging Face behaviours lesson 02 teaches, measured with the course's
meter (all on CPU, `smoke` size)."""
import contextlib
import functools

import pytest
import torch
from helpers import x_like
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

import course_utils.checkpointing as ck
from course_utils import learner_checks
from course_utils.checkpointing import Checkpointed, apply_checkpointing, segment_bounds
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.memory_model import block_bytes_per_token
from course_utils.memory_timeline import allocated_after
from course_utils.models import build_model
from course_utils.saved_tensors import SavedTensorMeter, measure_saved, saved_bytes

SMOKE = config_for("smoke", device="cpu")


POLICIES = ["none", "full", "every-2", "segments:1", "segments:2", "selective"]


def loss_and_grads(config):
    model = build_model(config)
    x, y = get_batch(config.batch_size, config.seq_len, seed=1)
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_checkpointing_gives_the_same_loss_and_gradients(policy):
    cfg = SMOKE.replace(n_layers=4, checkpoint="none")
    ref_loss, ref = loss_and_grads(cfg)
    loss, grads = loss_and_grads(cfg.replace(checkpoint=policy))
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    assert len(grads) == len(ref)  # the same parameters, in the same order (longer names)
    for (name, g), r in zip(grads.items(), ref.values()):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7, msg=name)


def test_policies_wrap_blocks_and_the_forward_is_a_plain_loop():
    model = build_model(SMOKE.replace(n_layers=5, checkpoint="segments:2"))
    assert [len(u.blocks) for u in model.layers] == [3, 2] == [b - a for a, b in segment_bounds(5, 2)]
    every = build_model(SMOKE.replace(n_layers=5, checkpoint="every-2"))
    assert [isinstance(u, Checkpointed) for u in every.layers] == [True, False, True, False, True]
    plain = build_model(SMOKE.replace(n_layers=5))
    assert sorted(p.data_ptr() for p in plain.parameters()) != []  # builds
    with pytest.raises(ValueError, match="already wrapped"):
        apply_checkpointing(every, "full")
    with pytest.raises(ValueError, match="Valid policies"):
        apply_checkpointing(plain, "every-0")
    import inspect
    src = inspect.getsource(type(plain).forward)
    assert "for block in self.layers:" in src and "checkpoint" not in src


def test_checkpoint_recomputes_once_and_keeps_gradients(cfg, block):
    x = x_like(cfg)
    calls = []
    hook = block.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        block.zero_grad(set_to_none=True)
        block(x).pow(2).mean().backward()
        plain = [p.grad.clone() for p in block.parameters()]
        n_plain = len(calls)
        block.zero_grad(set_to_none=True)
        checkpoint(block, x, use_reentrant=False).pow(2).mean().backward()
        n_ckpt = len(calls) - n_plain
    finally:
        hook.remove()
    assert (n_plain, n_ckpt) == (1, 2)
    for a, b in zip(plain, (p.grad for p in block.parameters())):
        torch.testing.assert_close(a, b)


def test_checkpoint_sequential_leaves_its_last_segment_plain(cfg):
    torch.manual_seed(0)
    layers = build_model(cfg.replace(n_layers=4)).layers
    x = x_like(cfg)
    unit = x.numel() * x.element_size()
    plain_block = block_bytes_per_token(cfg) * cfg.batch_size * cfg.seq_len

    plain = saved_bytes(lambda: layers[1](layers[0](x)), model=layers)  # two plain blocks, measured
    seq = saved_bytes(checkpoint_sequential, layers, 2, x, use_reentrant=False, model=layers)
    mine = saved_bytes(ck.checkpoint_every_segment, layers, x, 2, model=layers)
    assert mine == 2 * unit  # every segment checkpointed: only the 2 segment inputs
    assert plain == 2 * plain_block
    # checkpoint_sequential: segment 1 keeps its input, the last segment keeps everything
    assert seq == unit + plain
    assert seq > 5 * mine


def test_reentrant_checkpoint_loses_gradients_when_no_input_requires_grad(cfg, block):
    x = x_like(cfg, requires_grad=False)
    head = torch.nn.Linear(cfg.d_model, 3)
    for reentrant, expect_grads in ((True, False), (False, True)):
        block.zero_grad(set_to_none=True)
        with pytest.warns(UserWarning) if reentrant else contextlib.nullcontext():
            loss = head(checkpoint(block, x, use_reentrant=reentrant)).pow(2).mean()
        loss.backward()
        assert all((p.grad is not None) == expect_grads for p in block.parameters())


def test_selective_policy_keeps_less_than_none_and_recomputes_no_matmul(cfg):
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    layers = build_model(cfg.replace(n_layers=2)).layers
    x = x_like(cfg)
    mm = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in mm else CheckpointPolicy.PREFER_RECOMPUTE

    def run(mode):
        h = x
        for b in layers:
            if mode == "none":
                h = b(h)
            elif mode == "full":
                h = checkpoint(b, h, use_reentrant=False)
            else:
                h = checkpoint(b, h, use_reentrant=False, context_fn=functools.partial(
                    create_selective_checkpoint_contexts, policy))
        return h

    kept, flops = {}, {}
    for mode in ("none", "full", "sac"):
        out, kept[mode] = allocated_after(lambda mode=mode: run(mode))
        del out
        with FlopCounterMode(display=False) as counter:
            run(mode).sum().backward()
        # matmuls only: torch >= 2.15 also counts the CPU attention kernel, which this policy
        # recomputes (found by the support matrix's 'newest' stack)
        flops[mode] = sum(v for op, v in counter.get_flop_counts()["Global"].items()
                          if str(op) in learner_checks.MATMULS)
    assert kept["full"] < kept["sac"] < 0.8 * kept["none"]
    assert flops["sac"] == flops["none"] < flops["full"]
    # the saved-tensor hook cannot see what SAC caches: it reports the block inputs only
    assert saved_bytes(lambda: run("sac"), model=layers) == saved_bytes(lambda: run("full"),
                                                                        model=layers)


def test_hugging_face_gpt2_checkpointing_keeps_gradients_and_saves_less(cfg):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=256, n_positions=cfg.seq_len, n_embd=cfg.d_model,
                                     n_layer=2, n_head=cfg.n_heads, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()  # dropout on: RNG must be replayed
    ids = torch.randint(0, 256, (cfg.batch_size, cfg.seq_len))

    def grads_and_saved():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with SavedTensorMeter(model) as meter:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return [p.grad.clone() for p in model.parameters()], sum(meter.totals().values())

    plain_grads, plain_saved = grads_and_saved()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ckpt_grads, ckpt_saved = grads_and_saved()
    for a, b in zip(plain_grads, ckpt_grads):
        torch.testing.assert_close(a, b)
    assert ckpt_saved < plain_saved / 4


def test_gpt2_saves_what_the_course_model_saves_without_dropout_and_tanh_gelu(cfg):
    """Lesson 02 §8's explanation, checked: dropout and GPT-2's tanh GELU are the whole difference
    between GPT-2's saved tensors and the course model's of the same shape."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    shape = dict(vocab_size=256, n_positions=cfg.seq_len, n_embd=cfg.d_model, n_layer=2,
                 n_head=cfg.n_heads, bos_token_id=0, eos_token_id=0)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)

    def gpt2_saved(**changes):
        torch.manual_seed(0)
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, **changes)).train()
        return saved_bytes(lambda: m(input_ids=x, labels=x, use_cache=False).loss, model=m)

    no_dropout = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    as_built, plain = gpt2_saved(), gpt2_saved(**no_dropout)
    exact = gpt2_saved(**no_dropout, activation_function="gelu")
    course = sum(measure_saved(build_model(cfg.replace(n_layers=2)), x, y).totals().values())
    assert as_built > plain > exact
    assert exact == course


def test_recomputing_the_attention_core_keeps_no_seq_by_seq_tensor(cfg):
    """Lesson 02 §7: with naive attention, keeping only the linear layers' outputs removes the
    seq x seq matrices from what the forward keeps, and recomputes fewer FLOPs than full."""
    from torch.utils.flop_counter import FlopCounterMode
    aten = torch.ops.aten
    torch.manual_seed(0)
    c = cfg.replace(seq_len=4 * cfg.seq_len, attention="naive", n_layers=2)
    layers = build_model(c).layers
    x = torch.randn(1, c.seq_len, c.d_model, requires_grad=True)

    def keep_linear_outputs(ctx, op, *args, **kwargs):
        linear = op in (aten.mm.default, aten.addmm.default)
        return CheckpointPolicy.MUST_SAVE if linear else CheckpointPolicy.PREFER_RECOMPUTE

    runs = {"none": lambda: learner_checks.forward_plain(layers, x),
            "full": lambda: learner_checks.forward_full(layers, x),
            "core": lambda: learner_checks.forward_selective(layers, x, keep_linear_outputs)}
    kept, flops = {}, {}
    for name, run in runs.items():
        out, kept[name] = allocated_after(run)
        del out
        with FlopCounterMode(display=False) as counter:
            run().sum().backward()
        flops[name] = counter.get_total_flops()
    heads = c.n_heads
    square = heads * c.seq_len * c.seq_len * 4            # one block's fp32 softmax output
    linear = 9 * c.seq_len * c.d_model * 4                # qkv 3, proj 1, fc1 4, fc2 1 (per block)
    assert kept["none"] - kept["core"] >= 2 * square      # both blocks' seq x seq matrices gone
    assert kept["core"] == pytest.approx(2 * linear + x.numel() * 4 * 2, rel=0.05)
    assert flops["none"] < flops["core"] < flops["full"]


def test_checkpoint_every_segment_splits_with_segment_bounds(cfg):
    torch.manual_seed(0)
    blocks = build_model(cfg.replace(n_layers=5)).layers
    x = x_like(cfg)
    order = []
    hooks = [b.register_forward_pre_hook(lambda *_, i=i: order.append(i)) for i, b in enumerate(blocks)]
    try:
        out = ck.checkpoint_every_segment(blocks, x, 2)
        forward = list(order)
        out.sum().backward()
    finally:
        for h in hooks:
            h.remove()
    recomputed = order[len(forward):]
    # segment_bounds(5, 2) == [(0, 3), (3, 5)]: backward recomputes the last segment (3, 4) first
    assert forward == [0, 1, 2, 3, 4]
    assert recomputed == [3, 4, 0, 1, 2], recomputed
    unit = x.numel() * x.element_size()
    assert saved_bytes(ck.checkpoint_every_segment, blocks, x, 2, model=blocks) == 2 * unit
    # what policy 'segments:2' keeps in the model: the same two segment inputs (+ the token ids)
    xb, yb = get_batch(cfg.batch_size, cfg.seq_len)
    model = build_model(cfg.replace(n_layers=5, checkpoint="segments:2"))
    ids = xb.numel() * xb.element_size() + cfg.seq_len * 8
    assert measure_saved(model, xb, yb).totals()["activations"] == 2 * unit + ids
    with pytest.raises(ValueError, match="n_segments"):
        ck.checkpoint_every_segment(blocks, x, 6)


def test_library_selective_policy_keeps_matmuls_and_recomputes_no_matmul(cfg):
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    layers = build_model(cfg.replace(n_layers=2)).layers
    x = x_like(cfg)
    kept, flops = {}, {}
    for name, fwd in (("none", learner_checks.forward_plain), ("full", learner_checks.forward_full),
                      ("sac", lambda b, t: learner_checks.forward_selective(
                          b, t, ck.save_matmuls_and_attention))):
        kept[name] = learner_checks.kept_after_forward(fwd, layers, x)
        with FlopCounterMode(display=False) as counter:
            fwd(layers, x).sum().backward()
        flops[name] = counter.get_total_flops()
    assert kept["full"] < kept["sac"] < kept["none"]
    assert flops["sac"] == flops["none"] < flops["full"]


def test_memory_budget_modes_do_not_share_a_compiled_graph(cfg, monkeypatch):
    # Two budgets in one process: each keeps its own graph (a shared dynamo cache entry made the
    # second budget silently reuse the first one's graph). Inductor's code generation is swapped
    # for AOT autograd with the same min-cut partitioner (the part that reads the budget), which
    # keeps the test to seconds.
    import torch._inductor.compile_fx as compile_fx_module
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition_only(gm, example_inputs, **_):
        return aot_module_simplified(gm, example_inputs,
                                     fw_compiler=lambda g, _: make_boxed_func(g.forward),
                                     bw_compiler=lambda g, _: make_boxed_func(g.forward),
                                     partition_fn=min_cut_rematerialization_partition)

    monkeypatch.setattr(compile_fx_module, "compile_fx", partition_only)
    c = cfg.replace(n_layers=1)
    xb, yb = get_batch(c.batch_size, c.seq_len)
    keep_all = build_model(c.replace(checkpoint="memory-budget:1.0"))
    keep_least = build_model(c.replace(checkpoint="memory-budget:0.0"))
    saved_all = measure_saved(keep_all, xb, yb).totals()["activations"]
    saved_least = measure_saved(keep_least, xb, yb).totals()["activations"]
    plain = measure_saved(build_model(c), xb, yb).totals()["activations"]
    assert saved_least < saved_all / 4, (saved_least, saved_all)
    assert saved_all >= plain / 2
    assert measure_saved(keep_all, xb, yb).totals()["activations"] == saved_all  # still its own
    _, loss = keep_least(xb, yb)
    loss.backward()  # the recomputing graph trains
    assert all(p.grad is not None for p in keep_least.parameters())


def test_a_policy_that_does_not_fit_is_refused_in_korean(monkeypatch):
    """Issue 28: the refusal names the policy, the model's blocks and the valid policies in
    Korean; the policy names themselves stay as written in a config."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    with pytest.raises(ValueError) as refused:
        ck.parse_policy("every-9", 4)
    said = str(refused.value)
    assert said.startswith("체크포인트 정책 'every-9'은(는) 블록 4개짜리 모델에 맞지 않습니다: 9이(가)")
    assert "none, full, every-K, segments:N, selective, memory-budget:B" in said
