"""``course-profile``: profile your own model and print a recommendation card, e.g.::

    course-profile mypkg.models:make_model --batch-fn mypkg.data:batch --budget 8GiB
    course-profile --hf-config gpt2 --n-layer 6 --for t4 --out results/   # on a laptop

It runs `course_utils.card.profile_and_recommend`. The budget: ``--budget``; ``--for GPU``, the
memory CUDA reports on that GPU (`GPUS`; no check step); on a GPU, 90% of its free memory; else
no card, the profile alone. ``--out`` writes the card and tables as JSON after printing them.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys

from . import model_zoo, stand_in
from .card import budget_from_device, profile_and_recommend
from .cli_args import (
    add_precisions_and_policies,
    check_out_file,
    parse_bytes,
    positive_int,
    positive_seconds,
)
from .config import SIZE_PROFILES, size_profile
from .guard import memory_headroom
from .hardware import detect, recommend_precision, use_threads
from .i18n import tr
from .profiling import ModelSpec, profile
from .saved_tensors import saved_bytes
from .terms import GiB, default_device

__all__ = ["main", "GPUS"]

#: The GPUs ``--for`` plans for: (name as CUDA reports it, bytes CUDA reports as its memory, not
#: the marketing figure: an "80 GB" card reports about 79.2 GiB; where that figure comes from).
GPUS = {
    "t4": (stand_in.STAND_INS["t4"].name, stand_in.STAND_INS["t4"].memory_bytes,
           "course_utils.stand_in: deviceMemorySize 14.75GiB on a Tesla T4, NVIDIA/DALI issue 1813"),
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 42_298_834_944,
                  "CUDA's deviceQuery on one, CUDA 12.2: bottlerocket-os/bottlerocket PR 3873"),
    "a100-80gb": ("NVIDIA A100 80GB PCIe", 81_049 * 2**20,
                  "totalGlobalMem (MiB) on one, CUDA 12.3: ekondis/mixbench issue 47"),
    "h100": ("NVIDIA H100 80GB HBM3", 85_017_493_504,
             "torch.cuda.get_device_properties on one, torch 2.11, driver 580.159.04, read for "
             "this course (issue 27)"),
}


def _callable(text: str):
    mod, _, attr = text.partition(":")
    if not mod or not attr:
        raise argparse.ArgumentTypeError(tr("expected module:function, got {text!r}", text=text))
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise argparse.ArgumentTypeError(tr("cannot load {text!r}: {error}", text=text,
                                            error=e)) from None
    if not callable(obj):
        raise argparse.ArgumentTypeError(tr("{text!r} is not callable", text=text))
    return obj


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="course-profile",
        description=tr("Profile any PyTorch or Hugging Face model in each precision and "
                       "checkpoint policy (step time, peak memory, saved tensors), extrapolate its "
                       "peak to any batch, and print which recipe fits a memory budget, and why."))
    src = p.add_argument_group(tr("the model (one of)"))
    src.add_argument("model", nargs="?", type=_callable,
                     help=tr("module:function returning an nn.Module (needs --batch-fn)"))
    src.add_argument("--hf-config", metavar="MODEL_TYPE",
                     help=tr("a transformers model type built from its configuration class, "
                             "random weights, nothing downloaded: gpt2, llama, mistral..."))
    src.add_argument("--course-gpt", action="store_true", help=tr("the course's own GPT"))
    src.add_argument("--cnn", action="store_true", help=tr("a small residual CNN (no transformer)"))
    shape = p.add_argument_group(tr("dimensions (--hf-config; --course-gpt takes --size)"))
    for flag, default, what in (("--n-layer", None, tr("blocks")), ("--d-model", None, tr("width")),
                                ("--n-head", None, tr("attention heads")),
                                ("--seq-len", None, tr("tokens per sequence")),
                                ("--vocab-size", 256, tr("vocabulary (256: bytes)"))):
        shape.add_argument(flag, type=positive_int, default=default, help=what)
    shape.add_argument("--size", choices=list(SIZE_PROFILES),
                       help=tr("size profile for defaults (default: $COURSE_SIZE or the hardware's)"))
    fn = p.add_argument_group(tr("your own model"))
    fn.add_argument("--batch-fn", type=_callable,
                    help=tr("module:function, f(batch_size) -> batch (tensor, tuple or dict)"))
    fn.add_argument("--loss-fn", type=_callable, help=tr("module:function, f(output, batch) -> scalar loss"))
    fn.add_argument("--forward-fn", type=_callable, help=tr("module:function, f(model, batch) -> output"))
    fn.add_argument("--blocks", help=tr("dotted path of the repeated blocks (default: found automatically)"))
    run = p.add_argument_group(tr("what to measure"))
    budget = run.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=parse_bytes,
                        help=tr("memory budget, e.g. 14GiB (default on a GPU: 90%% of its free "
                                "memory; on a CPU without --for: the profile, no card)"))
    budget.add_argument("--for", dest="for_gpu", choices=list(GPUS),
                        help=tr("plan for this GPU: its memory, as CUDA reports it, is the budget "
                                "(measured here; for a laptop planning a rented GPU)"))
    run.add_argument("--target-batch", type=positive_int,
                     help=tr("effective batch wanted (micro-batch x accumulation steps)"))
    run.add_argument("--batch-size", type=positive_int,
                     help=tr("micro-batch that is timed (default: the size profile's)"))
    add_precisions_and_policies(
        run, precisions_help=tr("comma-separated (default: fp32 and this machine's recipe)"),
        policies_default=["none", "full", "selective", "offload"],
        policies_help=tr("comma-separated: none, full, every-K, selective, offload, "
                         "offload+checkpoint, hf (default: none,full,selective,offload)"))
    run.add_argument("--device", help=tr("cpu, cuda, cuda:N, mps (default: best)"))
    run.add_argument("--time-budget", type=positive_seconds,
                     help=tr("seconds of alternated timing (default: the size profile's)"))
    run.add_argument("--no-check", action="store_true",
                     help=tr("skip the real step that checks the predicted peak"))
    run.add_argument("--out",  # a string: a trailing / says "a folder"
                     help=tr("write the card and tables as JSON: a file, or a folder (an existing "
                             "one, or a new one ending in /) for course-profile-<model>.json"))
    return p


def _zoo(args, parser):
    size = args.size or size_profile()
    chosen = [bool(args.model), bool(args.hf_config), args.course_gpt, args.cnn]
    if sum(chosen) != 1:
        parser.error(tr("give exactly one model: module:function, --hf-config TYPE, --course-gpt "
                        "or --cnn"))
    if args.model is not None:
        if args.batch_fn is None:
            parser.error(tr("a model given as module:function needs --batch-fn module:function"))
        return model_zoo.ZooModel(getattr(args.model, "__name__", "model"), args.model,
                                  args.batch_fn, args.loss_fn, args.forward_fn), 4
    if args.course_gpt:
        return model_zoo.course_gpt(size), SIZE_PROFILES[size]["batch_size"]
    if args.cnn:
        return model_zoo.small_cnn(), 8
    dims = dict(model_zoo.HF_SIZES.get(size, model_zoo.HF_SIZES["cpu"]))
    dims.update({key: val for key, val in (("n_layers", args.n_layer), ("d_model", args.d_model),
                                           ("n_heads", args.n_head), ("seq_len", args.seq_len))
                 if val is not None})
    if dims["d_model"] % dims["n_heads"]:
        parser.error(tr("--d-model {d_model} must be divisible by --n-head {n_heads}",
                        d_model=dims["d_model"], n_heads=dims["n_heads"]))
    try:
        model_zoo.require_transformers().utils.logging.set_verbosity_error()  # a CLI prints the card only
        return model_zoo.hf_causal_lm(args.hf_config, vocab_size=args.vocab_size, **dims), 4
    except ImportError as e:
        parser.error(str(e))
    except (ValueError, KeyError):
        parser.error(tr("--hf-config {model_type!r} is not a transformers model type (for example "
                        "gpt2, llama, mistral, qwen2: the keys of transformers.CONFIG_MAPPING)",
                        model_type=args.hf_config))


def _budget(args, device: str) -> tuple[int | None, str | None]:
    """The memory budget (bytes) and where it comes from in words (None: the default)."""
    if args.budget is not None:
        return args.budget, None
    if args.for_gpu is not None:
        name, nbytes, _ = GPUS[args.for_gpu]
        return nbytes, tr("a {gpu}'s memory as CUDA reports it: --for {key}", gpu=name,
                          key=args.for_gpu)
    try:
        return budget_from_device(device)[0], None
    except ValueError:
        return None, None


def check_batch_fits(zoo, batch_size: int, device: str, blocks=None) -> None:
    """Refuse, before any step, a micro-batch whose saved tensors alone (one sample's, measured
    at a batch of 1, times ``batch_size``: a lower bound of the peak) exceed the memory this
    process may still use (`course_utils.guard.memory_headroom`): ValueError, with the largest
    batch it allows."""
    spec = ModelSpec.create(zoo.build, zoo.make_batch, zoo.loss_fn, forward=zoo.forward,
                            blocks=blocks, device=device)
    model, one = spec.fresh("none"), spec.batch(1)
    per_sample = saved_bytes(lambda: spec.loss_fn(spec.forward(model, one), one), model=model)
    free, where = memory_headroom(detect(device))
    if free and per_sample and per_sample * batch_size > free:
        raise ValueError(tr(
            "micro-batch {batch}: its saved tensors alone would take {need:.2f} GiB ({per_sample:,} "
            "bytes per sample, measured at a batch of 1), more than the {free:.2f} GiB {where}: "
            "give --batch-size {largest} or less (a bound: the step needs more than this).",
            batch=batch_size, need=per_sample * batch_size / GiB, per_sample=per_sample,
            free=free / GiB, where=tr(where), largest=max(1, free // per_sample)))


def _json(prof, exs, card) -> str:
    data = {"card": None if card is None else card.as_dict(),
            "profile": json.loads(prof.table().drop(columns=["config"], errors="ignore")
                                  .to_json(orient="records")),
            "extrapolation": {p: {"per_sample_bytes": {k: f.per_sample for k, f in e.fits.items()},
                                  "intercept_bytes": {k: f.intercept for k, f in e.fits.items()},
                                  "optimizer_peak_bytes": {k: f.optimizer_peak
                                                           for k, f in e.fits.items()},
                                  "block_saved_per_sample": e.block_saved,
                                  "block_input_per_sample": e.block_input}
                              for p, e in exs.items()}}
    return json.dumps(data, indent=2, default=str)


def _run(args, zoo, batch_size: int, device: str, budget: int | None, source: str | None):
    """The profile, its extrapolations and the card (None, with no budget: the profile only)."""
    kw = dict(precisions=args.precisions, policies=args.policies, batch_size=batch_size,
              device=device, blocks=args.blocks, forward=zoo.forward, budget_s=args.time_budget,
              name=zoo.name, progress=sys.stderr.isatty())
    if budget is None:  # the same default precisions as profile_and_recommend
        kw["precisions"] = args.precisions or tuple(dict.fromkeys(
            ["fp32", recommend_precision(detect(device)).precision]))
        return profile(zoo.build, zoo.make_batch, zoo.loss_fn, **kw), {}, None
    prof, exs, card = profile_and_recommend(
        zoo.build, zoo.make_batch, zoo.loss_fn, budget_bytes=budget,
        target_batch=args.target_batch, check=not args.no_check and args.for_gpu is None, **kw)
    if source is not None:
        card = dataclasses.replace(card, budget_source=source)
    return prof, exs, card


def main(argv=None) -> int:
    """Entry point of ``course-profile``; returns the exit status (0: printed; 1: printed, but
    ``--out`` could not be written; 2: bad arguments or a model that cannot be profiled)."""
    parser = _parser()
    args = parser.parse_args(argv)
    zoo, default_batch = _zoo(args, parser)
    out = None
    if args.out is not None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", zoo.name).strip("-") or "model"
        try:
            out = check_out_file(args.out, f"course-profile-{name}.json")
        except ValueError as e:
            parser.error(str(e))
    device = args.device or default_device()
    budget, source = _budget(args, device)
    if args.for_gpu is not None:
        gpu, nbytes, whence = GPUS[args.for_gpu]
        print("course-profile: " + tr(
            "planning for a {gpu}: budget {budget:.2f} GiB, the memory CUDA reports on one "
            "({source}). Measured on {device}: step times are this machine's, not the GPU's, and "
            "the GPU's kernels can change the peak; no check step (it would run a batch sized for "
            "the GPU here).", gpu=gpu, budget=nbytes / GiB, source=whence, device=device))
    use_threads()
    try:
        batch_size = args.batch_size or default_batch
        check_batch_fits(zoo, batch_size, device, args.blocks)
        prof, exs, card = _run(args, zoo, batch_size, device, budget, source)
    except (ValueError, TypeError, KeyError) as e:
        print(f"course-profile: {e}", file=sys.stderr)
        return 2
    print(tr("{model}: {n_blocks} x {block_type} at {path!r}, {millions:.2f} M parameters",
             model=prof.name, n_blocks=prof.n_blocks, block_type=prof.block_type,
             path=prof.blocks, millions=prof.n_parameters / 1e6) + "\n")
    print(prof.summary().to_string())
    print()
    if card is None:
        print(tr("No recommendation card: {device} has no GPU memory to take a budget from. For "
                 "one, plan for a GPU (--for {gpus}) or give a budget (--budget 14GiB).",
                 device=device, gpus="|".join(GPUS)))
    else:
        print(card.text())
    if out is not None:
        try:
            out.parent.mkdir(exist_ok=True)
            out.write_text(_json(prof, exs, card))
        except OSError as e:
            print("course-profile: " + tr("could not write {path}: {error} (the results are "
                                          "printed above)", path=out, error=e.strerror or e),
                  file=sys.stderr)
            return 1
        print("\n" + tr("wrote {paths}", paths=out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
