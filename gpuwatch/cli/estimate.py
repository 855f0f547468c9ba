"""``gpuwatch estimate``: predicted memory per phase before any run.

The options are parsed here and answered by :func:`gpuwatch.predict.estimate` (the plan,
the live predictor's answer for it, the fit); ``--from`` loads a recording first.
``--trace`` instead builds the user's own model and traces one training step of it
under the options given (``_trace.py``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..fmt import fmt_bytes
from ..predict import (
    EstimateError,
    Options,
    Result,
    Target,
    changes_from_options,
    estimate,
    gpus_of,
    parse_count,
    parse_positive,
    parse_probability,
    plan_result,
    reserve_of,
    table,
)
from ._common import EXIT_OK, CliError, Command


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` that says what is wrong in the parser's own words."""

    def check(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    check.__name__ = parse.__name__
    return check


_positive = _typed(parse_positive)

_SIZES = {
    "layers": "number of layers",
    "hidden": "hidden size",
    "heads": "attention heads",
    "kv-heads": "key/value heads (grouped-query attention)",
    "head-dim": "each head's width, where heads do not divide hidden (GPT-3 XL: 128)",
    "intermediate": "MLP inner size (default 4 x hidden; 8/3 x hidden for llama)",
    "vocab": "vocabulary size (not for vit)",
}


def _options(p: argparse.ArgumentParser) -> None:
    """The model, its training, its GPUs and layout, and where the answer comes from."""
    _model_options(p.add_argument_group("model"))
    _training_options(p)
    _layout_options(p.add_argument_group("GPUs and layout (per rank)"))
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--from",
        dest="recording",
        metavar="FILE",
        help="re-plan a recorded run (its facts, its GPU, its out-of-memory error) under"
        " the options given: --batch, --checkpointing, --layout, --gpus, --lora-rank, ...",
    )
    p.add_argument(
        "--trace",
        metavar="MODULE:FUNCTION",
        help="build your own model with FUNCTION() (which may take batch= and seq=) on fake"
        " tensors and plan it with these options: layout, precision, checkpointing, ...",
    )


def _model_options(src: Any) -> None:
    from ..predict import ARCHS

    src.add_argument(
        "--params",
        type=_typed(parse_count),
        metavar="N",
        help="parameter count (124M, 7B, 1.3e9; K/M/B/T suffixes): alone, weights, "
        "gradients and optimizer state (activations unknown); with a shape or config, it "
        "must agree with it",
    )
    src.add_argument(
        "--config",
        metavar="FILE",
        help="a Hugging Face config.json (gpt2, llama, mistral, qwen2, falcon, bert, roberta,"
        " gpt_neox, vit)",
    )
    src.add_argument(
        "--arch",
        choices=ARCHS,
        default=None,
        help="layer layout of a shape given by options, or of a config without a known "
        "model_type (default: gpt, llama with --kv-heads)",
    )
    for name, what in _SIZES.items():
        src.add_argument(f"--{name}", type=_positive, help=what)
    src.add_argument("--image-size", type=_positive, help="vit: image side in pixels (224)")
    src.add_argument("--patch-size", type=_positive, help="vit: patch side in pixels (16)")


def _training_options(p: Any) -> None:
    from ..predict import IMPLS, OPTIMIZERS, PRECISIONS

    p.add_argument(
        "--seq", type=_positive, help="sequence length (default: the config's positions)"
    )
    p.add_argument("--batch", type=_positive, default=None, help="micro-batch size (default 1)")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="weights' dtype and autocast (default bf16-mixed: fp32 weights, bf16 autocast)",
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    p.add_argument("--optimizer-impl", choices=IMPLS, default="foreach", help="default foreach")
    p.add_argument(
        "--attention",
        choices=("eager", "sdpa", "flash_attention_2"),
        default="sdpa",
        help="default sdpa",
    )
    p.add_argument(
        "--dropout",
        type=_typed(parse_probability),
        metavar="P",
        help="dropout probability everywhere (default: the config's, else 0); dropout "
        "keeps a mask per dropped tensor",
    )
    p.add_argument("--checkpointing", action="store_true", help="checkpoint every layer")
    p.add_argument(
        "--checkpoint-every",
        type=_positive,
        default=1,
        metavar="K",
        help="with --checkpointing (implied): checkpoint every K-th layer only (layers K, "
        "2K, ... as torchtitan's ac_freq); the others keep all they save",
    )
    _adapter_options(p)


def _adapter_options(p: Any) -> None:
    p.add_argument(
        "--lora-rank", type=_positive, default=0, metavar="R", help="train LoRA adapters of rank R"
    )
    p.add_argument(
        "--lora-targets",
        default="q,v",
        metavar="ROLES",
        help="roles LoRA adapts: q,k,v,o,gate,up,down; attn, mlp, all-linear (default q,v)",
    )
    p.add_argument(
        "--qlora",
        action="store_true",
        help="QLoRA: the layers' weights in 4-bit NF4 (double-quantised constants), bf16"
        " compute; with --lora-rank",
    )
    p.add_argument(
        "--loss",
        choices=("inside", "outside", "outside-unshifted"),
        default="inside",
        help="where the loss is computed: by the model given labels (default), or after it"
        " returned, with the usual shift (outside: logits[:, :-1] made contiguous, a copy)"
        " or without",
    )
    p.add_argument(
        "--accumulation",
        type=_positive,
        default=1,
        metavar="K",
        help="micro-batches per optimizer step (gradient accumulation; default 1)",
    )


def _layout_options(run: Any) -> None:
    run.add_argument(
        "--gpus",
        metavar="NxGPU",
        help="GPUs per node: 4xA100-80GB, 8xH100-80GB, 2x24GiB; answers whether it fits",
    )
    run.add_argument("--nodes", type=_positive, default=1, help="nodes (default 1)")
    run.add_argument(
        "--layout",
        default=None,
        metavar="LAYOUT",
        help="ddp, fsdp (FSDP2), fsdp-no-reshard, fsdp1, fsdp1-grad-op (SHARD_GRAD_OP), zero1,"
        " zero2, zero3, tp=N or device-map (default: ddp on several GPUs)",
    )
    run.add_argument(
        "--fsdp-units",
        metavar="UNITS",
        help="FSDP's units around the root, in forward order: layers (default: each layer,"
        " the root holding embedding, norm and head), embed, norm, head, [a,b] one unit of"
        " two: embed,layers,[norm,head]",
    )
    run.add_argument(
        "--mp-policy",
        metavar="PARAM[,REDUCE]",
        help="FSDP's MixedPrecisionPolicy: units gathered and computed in PARAM (bf16),"
        " gradients reduced in REDUCE (default fp32); fp32 weights unless --precision",
    )
    run.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="plan a run on GPUs (default) or on this machine's CPU, to check a plan here",
    )
    run.add_argument(
        "--backend",
        choices=("nccl", "gloo", "fake"),
        default=None,
        help="--trace: the run's process group (default nccl on GPUs, gloo on the CPU;"
        " fake: torch's fake group, one rank of a job too big to run here)",
    )
    run.add_argument(
        "--offload",
        action="store_true",
        help="optimizer states on the host (ZeRO-Offload; FSDP's CPUOffloadPolicy)",
    )
    run.add_argument(
        "--reserve",
        default="1GiB",
        metavar="SIZE",
        help="memory of each GPU torch cannot have: CUDA context, NCCL (default 1GiB)",
    )


def answer_for(args: argparse.Namespace) -> Result:
    """What ``gpuwatch estimate`` answers for the parsed options (``--from`` included).

    Raises:
        CliError: The options are wrong or the model cannot be read (one line).
    """
    options = Options.from_values(args)
    try:
        if args.recording:
            return _from_recording(args.recording, options)
        return estimate(options)
    except EstimateError as exc:
        raise CliError(str(exc)) from None


def _from_recording(path: str, options: Options) -> Result:
    """``--from FILE``: the recorded run's plan, its GPU and its out-of-memory error, with
    the options given as changes."""
    from ..analysis.oom_answer import recorded_plan
    from ..predict import Gpus, rank_estimate
    from ..store.loader import load

    try:
        session = load(path)
    except Exception as exc:  # a file that is not a recording, in any way
        raise CliError(f"cannot read {path}: {str(exc)[:200]}") from None
    try:
        rec = recorded_plan(session)
    except ValueError as exc:
        raise CliError(f"{path}: {exc}") from None
    plan, oom = rec.plan, rec.oom
    assumed = [f"the plan of pid {rec.pid} in {os.path.basename(path)}, from its facts"]
    assumed += rec.assumed
    change = changes_from_options(options)
    if options.gpus:
        gpus = gpus_of(options.gpus)
        change["world"] = gpus.count * options.nodes
    else:
        body = oom.body if oom is not None and isinstance(oom.body, dict) else {}
        total = rec.gpu_total or int(body.get("total") or 0)
        if not total:
            raise CliError(f"{path}: no GPU's memory recorded; give --gpus")
        count = max(plan.world // options.nodes, 1)
        gpus = Gpus(count, rec.gpu or "recorded GPU", total)
    world = change.get("world", plan.world)
    if change.get("layout", plan.layout) != "none" and isinstance(world, int) and world < 2:
        change.setdefault("world", gpus.count * options.nodes)
    plan = replace(plan, **change)  # type: ignore[arg-type]
    if change:
        assumed.append("changed: " + ", ".join(f"{k} {v}" for k, v in change.items()))
    reserve = reserve_of(options.reserve)
    assumed.append(
        f"{gpus.count} x {gpus.name}: {fmt_bytes(gpus.usable(reserve))} each for torch"
        f" ({fmt_bytes(reserve)} reserved: --reserve)"
    )
    out = plan_result(plan, assumed, Target(gpus, reserve, options.nodes))
    out["recorded"] = {
        "pid": rec.pid,
        "oom": {"phase": rec.phase, "demand_bytes": rec.demand} if oom is not None else None,
        "predicted_peak_bytes": rank_estimate(rec.recorded).peak_bytes,
    }
    return out


def cmd_estimate(args: argparse.Namespace) -> int:
    """``gpuwatch estimate``."""
    if args.trace:
        from ._trace import trace_estimate

        answered: Any = trace_estimate(args)
    else:
        answered = answer_for(args)
    print(json.dumps(answered, indent=2) if args.json else table(answered))
    return EXIT_OK


def oom_answer(path: str) -> dict[str, Any] | None:
    """What ``estimate --from PATH`` answers, for ``info`` of a recording with an
    out-of-memory error: ``{"command", "fits", "changes"}``, or None where the recording
    cannot be planned (no facts, no GPU's memory)."""
    try:
        fit = _from_recording(path, Options()).get("fit")
    except (CliError, EstimateError):
        return None
    if fit is None:
        return None
    return {
        "command": f"gpuwatch estimate --from {path}",
        "fits": fit["fits"],
        "peak_bytes": fit["peak_bytes"],
        "max_batch": fit["max_batch"],
        "changes": fit["changes"][:3],
    }


def oom_answer_lines(answer: dict[str, Any]) -> list[str]:
    """``info``'s lines for :func:`oom_answer`."""
    lines = [f"what would have fitted ({answer['command']}):"]
    if answer["max_batch"]:
        lines.append(f"  largest micro-batch that fits: {answer['max_batch']}")
    for c in answer["changes"]:
        state = "fits" if c["fits"] else "short"
        lines.append(
            f"  {c['flags']}: peak {fmt_bytes(c['peak_bytes'])} per rank ({state}); {c['cost']}"
        )
    return lines


COMMANDS = (
    Command(
        "estimate",
        help="predict GPU memory per training phase before running",
        description="Predict memory per phase (weights, gradients, optimizer state, "
        "activations, temporaries) for a transformer, before any run: decoders (GPT-2, "
        "LLaMA, GPT-NeoX), encoders (BERT, RoBERTa) and ViT. It prints what it assumed.",
        options=_options,
        run=cmd_estimate,
    ),
)
