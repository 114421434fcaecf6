"""``course-profile``: profile your own model and print a recommendation card.

Examples::

    course-profile --hf-config gpt2 --n-layer 6 --seq-len 512 --budget 14GiB
    course-profile --hf-config llama --n-layer 4 --d-model 256 --budget 2GiB --target-batch 64
    course-profile mypkg.models:make_model --batch-fn mypkg.data:batch --budget 8GiB
    course-profile --course-gpt --size smoke --budget 16MiB --out card.json

A model given as ``module:function`` is a function of no arguments returning an ``nn.Module``;
``--batch-fn module:function`` makes a batch (``f(batch_size)``), ``--loss-fn`` takes
``(output, batch)`` and returns a scalar, ``--forward-fn`` takes ``(model, batch)``
(`course_utils.profiling.profile` documents the defaults). It runs
`course_utils.card.profile_and_recommend`: the profile (every precision x policy, timed in
alternation), the extrapolated peak per policy, the card, and one real step that checks it.
``--out FILE`` writes the card, the profile's table and the extrapolations as JSON. Every
argument is checked before anything runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from . import model_zoo
from .card import profile_and_recommend
from .cli_args import add_precisions_and_policies, parse_bytes, positive_int
from .config import SIZE_PROFILES, size_profile
from .hardware import use_threads

__all__ = ["main"]


def _callable(text: str):
    mod, _, attr = text.partition(":")
    if not mod or not attr:
        raise argparse.ArgumentTypeError(f"expected module:function, got {text!r}")
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise argparse.ArgumentTypeError(f"cannot load {text!r}: {e}") from None
    if not callable(obj):
        raise argparse.ArgumentTypeError(f"{text!r} is not callable")
    return obj


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="course-profile",
        description="Profile any PyTorch or Hugging Face model in each precision and checkpoint "
                    "policy (step time, peak memory, saved tensors), extrapolate its peak to any "
                    "batch, and print which recipe fits a memory budget, and why.")
    src = p.add_argument_group("the model (one of)")
    src.add_argument("model", nargs="?", type=_callable, default=None,
                     help="module:function returning an nn.Module (needs --batch-fn)")
    src.add_argument("--hf-config", metavar="MODEL_TYPE", default=None,
                     help="a transformers model type built from its configuration class, random "
                          "weights, nothing downloaded: gpt2, llama, mistral...")
    src.add_argument("--course-gpt", action="store_true", help="the course's own GPT")
    src.add_argument("--cnn", action="store_true", help="a small residual CNN (no transformer)")
    shape = p.add_argument_group("dimensions (--hf-config; --course-gpt takes --size)")
    for flag, default, what in (("--n-layer", None, "blocks"), ("--d-model", None, "width"),
                                ("--n-head", None, "attention heads"),
                                ("--seq-len", None, "tokens per sequence"),
                                ("--vocab-size", 256, "vocabulary (256: bytes)")):
        shape.add_argument(flag, type=positive_int, default=default, help=what)
    shape.add_argument("--size", choices=list(SIZE_PROFILES), default=None,
                       help="size profile for defaults (default: $COURSE_SIZE or the hardware's)")
    fn = p.add_argument_group("your own model")
    fn.add_argument("--batch-fn", type=_callable, default=None,
                    help="module:function, f(batch_size) -> batch (tensor, tuple or dict)")
    fn.add_argument("--loss-fn", type=_callable, default=None,
                    help="module:function, f(output, batch) -> scalar loss")
    fn.add_argument("--forward-fn", type=_callable, default=None,
                    help="module:function, f(model, batch) -> output")
    fn.add_argument("--blocks", default=None,
                    help="dotted path of the repeated blocks (default: found automatically)")
    run = p.add_argument_group("what to measure")
    run.add_argument("--budget", type=parse_bytes, default=None,
                     help="memory budget, e.g. 14GiB (default on a GPU: 90%% of its free memory; "
                          "required on a CPU)")
    run.add_argument("--target-batch", type=positive_int, default=None,
                     help="effective batch wanted (micro-batch x accumulation steps)")
    run.add_argument("--batch-size", type=positive_int, default=None,
                     help="micro-batch that is timed (default: the size profile's)")
    add_precisions_and_policies(
        run, precisions_help="comma-separated (default: fp32 and this machine's recipe)",
        policies_default=["none", "full", "selective", "offload"],
        policies_help="comma-separated: none, full, every-K, selective, offload, "
                      "offload+checkpoint, hf (default: none,full,selective,offload)")
    run.add_argument("--device", default=None, help="cpu, cuda, cuda:N, mps (default: best)")
    run.add_argument("--time-budget", type=float, default=None,
                     help="seconds of alternated timing (default: the size profile's)")
    run.add_argument("--no-check", action="store_true",
                     help="skip the real step that checks the predicted peak")
    run.add_argument("--out", type=Path, default=None, help="write the card and tables as JSON")
    return p


def _zoo(args, parser):
    size = args.size or size_profile()
    chosen = [bool(args.model), bool(args.hf_config), args.course_gpt, args.cnn]
    if sum(chosen) != 1:
        parser.error("give exactly one model: module:function, --hf-config TYPE, --course-gpt or "
                     "--cnn")
    if args.model is not None:
        if args.batch_fn is None:
            parser.error("a model given as module:function needs --batch-fn module:function")
        return model_zoo.ZooModel(getattr(args.model, "__name__", "model"), args.model,
                                  args.batch_fn, args.loss_fn, args.forward_fn), 4
    if args.course_gpt:
        return model_zoo.course_gpt(size), SIZE_PROFILES[size]["batch_size"]
    if args.cnn:
        return model_zoo.small_cnn(), 8
    dims = dict(model_zoo.HF_SIZES.get(size, model_zoo.HF_SIZES["cpu"]))
    for key, val in (("n_layers", args.n_layer), ("d_model", args.d_model),
                     ("n_heads", args.n_head), ("seq_len", args.seq_len)):
        if val is not None:
            dims[key] = val
    if dims["d_model"] % dims["n_heads"]:
        parser.error(f"--d-model {dims['d_model']} must be divisible by --n-head {dims['n_heads']}")
    try:
        model_zoo.require_transformers().utils.logging.set_verbosity_error()  # a CLI prints the card only
        return model_zoo.hf_causal_lm(args.hf_config, vocab_size=args.vocab_size, **dims), 4
    except ImportError as e:
        parser.error(str(e))
    except (ValueError, KeyError):
        parser.error(f"--hf-config {args.hf_config!r} is not a transformers model type (for example "
                     "gpt2, llama, mistral, qwen2: the keys of transformers.CONFIG_MAPPING)")


def main(argv=None) -> int:
    """Entry point of ``course-profile``; returns the exit status (0: card printed)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is not None and args.out.parent and not args.out.parent.exists():
        parser.error(f"--out: folder {args.out.parent} does not exist")
    if args.time_budget is not None and not args.time_budget > 0:
        parser.error("--time-budget must be > 0 seconds")
    zoo, default_batch = _zoo(args, parser)
    use_threads()
    try:
        prof, exs, card = profile_and_recommend(
            zoo.build, zoo.make_batch, zoo.loss_fn, budget_bytes=args.budget,
            target_batch=args.target_batch, precisions=args.precisions, policies=args.policies,
            batch_size=args.batch_size or default_batch, device=args.device, blocks=args.blocks,
            forward=zoo.forward, budget_s=args.time_budget, name=zoo.name,
            check=not args.no_check, progress=sys.stderr.isatty())
    except (ValueError, TypeError, KeyError) as e:
        print(f"course-profile: {e}", file=sys.stderr)
        return 2
    print(f"{prof.name}: {prof.n_blocks} x {prof.block_type} at {prof.blocks!r}, "
          f"{prof.n_parameters / 1e6:.2f} M parameters\n")
    print(prof.summary().to_string())
    print()
    print(card.text())
    if args.out is not None:
        data = {"card": card.as_dict(),
                "profile": json.loads(prof.table().drop(columns=["config"], errors="ignore")
                                      .to_json(orient="records")),
                "extrapolation": {p: {"per_sample_bytes": {k: f.per_sample for k, f in e.fits.items()},
                                      "intercept_bytes": {k: f.intercept for k, f in e.fits.items()},
                                      "optimizer_peak_bytes": {k: f.optimizer_peak
                                                               for k, f in e.fits.items()},
                                      "block_saved_per_sample": e.block_saved,
                                      "block_input_per_sample": e.block_input}
                                  for p, e in exs.items()}}
        args.out.write_text(json.dumps(data, indent=2, default=str))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
