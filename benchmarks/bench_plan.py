"""The plan made before the run against the same run's truth, per rank and phase (issue 52).

Two routes of ``gpuwatch estimate`` are planned before anything runs, then each case
trains for three steps as real gloo ranks on the CPU (or as rank 0 of eight through
torch's fake process group) under the profiler truth of ``bench_ranks.py``
(``tests/support/profmem.py``: each rank's allocator events, frees made on gloo's thread
settled):

- the ``--trace`` route, of a model that is not a transformer: the 12-block residual MLP
  of ``tests/support/ranks_cases.py`` (25.2 M parameters), built by :func:`mlp` or
  :func:`mlp_lora` below, with the run's options (``--gpus``, ``--layout``,
  ``--precision``, ``--accumulation``, ``--checkpointing``, ``--optimizer-impl``) under
  DDP, DDP with two micro-batches, DDP under bf16 autocast, FSDP2 with every block
  checkpointed under bf16 autocast or under ``MixedPrecisionPolicy(bf16, fp32)``, FSDP1,
  LoRA under DDP and FSDP2, rank 0 of an 8-rank FSDP2 job, and tensor parallel;
- the config route, of the Llama-style causal LM of ``ranks_cases`` given as its Hugging
  Face config (``shape_from_config`` and the plan ``estimate`` makes of it) under DDP,
  FSDP2 (rank 0 of eight too, and with every 2nd layer checkpointed), LoRA under FSDP2
  and tensor parallel.

Tensor parallel (``tp``): the trace splits each block's pair of Linear layers by
columns then rows (its default plan), as the truth's ``parallelize_module`` plan written
out does. ZeRO needs DeepSpeed: skipped where it is not installed.
Printed: case x rank x step x phase x (truth, plan, ratio), and as the anchor, what the
old ``--trace`` answered: the model traced whole on one GPU, the layout and the options
ignored, one peak per step standing for each of its phases.
PASS when every rank's every phase at steps 1 and 3 is within 10%.

Run: python benchmarks/bench_plan.py [--quick] [case ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

TOLERANCE = 0.10
STEPS = 3
CHECKED_STEPS = (1, 3)
PHASES = ("forward", "backward", "optimizer.step", "zero_grad")
DIM, BATCH, LORA = 1024, 64, 8

TRACE_CASES: dict[str, dict[str, Any]] = {
    "ddp": {"layout": "ddp", "world": 2},
    "ddp-accum2": {"layout": "ddp", "world": 2, "accumulation": 2},
    "ddp-bf16": {"layout": "ddp", "world": 2, "precision": "bf16-mixed"},
    "fsdp2-ckpt-bf16": {
        "layout": "fsdp",
        "world": 2,
        "checkpointing": True,
        "precision": "bf16-mixed",
    },
    "fsdp2-ckpt-mp": {"layout": "fsdp", "world": 2, "checkpointing": True, "mp_policy": "bf16"},
    "fsdp1": {"layout": "fsdp1", "world": 2},
    "lora-ddp": {"layout": "ddp", "world": 2, "lora": LORA},
    "lora-fsdp2": {"layout": "fsdp", "world": 2, "lora": LORA},
    "fsdp2-fake8": {"layout": "fsdp", "world": 8, "fake": True},
    "tp": {"layout": "tp=2", "world": 2},
    "zero2": {"layout": "zero2", "world": 2, "zero": True},
}
"""``--trace`` cases of the MLP: the options given to ``estimate`` and to the run alike."""

CONFIG_CASES: dict[str, dict[str, Any]] = {
    "ddp-hf": {"layout": "ddp"},
    "fsdp2-hf": {"layout": "fsdp"},
    "fsdp2-hf-fake8": {"layout": "fsdp"},
    "fsdp2-hf-fake8-ckpt2": {"layout": "fsdp", "checkpointing": True, "checkpoint_every": 2},
    "fsdp2-hf-lora": {"layout": "fsdp", "lora_rank": LORA, "lora_targets": ("q", "v")},
    "tp-hf": {"layout": "tp=2"},
    "zero2-hf": {"layout": "zero2"},
}
"""Config-route cases: ``ranks_cases.CASES`` runs them; the plan is told the layout."""

QUICK = [
    "ddp-accum2",
    "fsdp2-ckpt-bf16",
    "fsdp2-fake8",
    "tp",
    "config:ddp-hf",
    "config:fsdp2-hf-fake8",
]


# --------------------------------------------------------------------------- the builders


def _square(out: Any) -> Any:
    return out.square().mean()


def mlp(batch: int = BATCH) -> Any:
    """``--trace`` builder: the MLP, its loss (outside the model) and a batch."""
    import torch
    from ranks_cases import MLP

    return MLP(), _square, torch.randn(batch, DIM)


def mlp_lora(batch: int = BATCH) -> Any:
    """``--trace`` builder: the MLP with its blocks frozen and rank-8 adapters."""
    import torch
    from ranks_cases import MLP

    return MLP(lora=LORA), _square, torch.randn(batch, DIM)


# --------------------------------------------------------------------------- the plans


def _argv(case: dict[str, Any]) -> list[str]:
    builder = "mlp_lora" if case.get("lora") else "mlp"
    argv = [
        "--trace",
        f"{Path(__file__).resolve()}:{builder}",
        "--gpus",
        f"{case['world']}x80GiB",
        "--layout",
        case["layout"],
        "--precision",
        case.get("precision", "fp32"),
        "--optimizer-impl",
        "for-loop",  # AdamW's default on the CPU
    ]
    if case.get("accumulation", 1) > 1:
        argv += ["--accumulation", str(case["accumulation"])]
    if case.get("checkpointing"):
        argv.append("--checkpointing")
    if case.get("mp_policy"):
        argv += ["--mp-policy", case["mp_policy"]]
    if case.get("fake"):  # its truth: rank 0 on the fake group, no gloo work buffers
        argv += ["--backend", "fake"]
    return argv


def trace_plan(case: dict[str, Any]) -> dict[str, Any]:
    """``gpuwatch estimate --trace ...`` for the case, on the CPU's rules, as --json."""
    from gpuwatch.cli._common import CliError
    from gpuwatch.cli._trace import trace_estimate
    from gpuwatch.cli.estimate import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    argv = _argv(case)
    args, extra = parser.parse_known_args(["estimate", *argv, "--device", "cpu"])
    if extra == ["--device", "cpu"]:  # an estimate without --device: the CPU set by hand
        args.device = "cpu"
    try:
        return trace_estimate(args)
    except CliError as exc:
        return {"refused": str(exc)}


def anchor_plan(case: dict[str, Any]) -> dict[tuple[int, str], int]:
    """What the old ``--trace`` gave: the model traced whole, on one GPU, no layout, no
    options (its one running peak per step stands for every phase of that step)."""
    from gpuwatch.predict import total

    one = dict(case, layout="none", world=1, accumulation=1)
    one.pop("checkpointing", None)
    got = trace_plan(dict(one, precision="fp32"))
    if "refused" in got:
        return {}
    step1 = max(total(b) for b in got["first_step"].values())
    later = max(total(b) for b in got["phases"].values())
    return {(s, ph): step1 if s == 1 else later for s in CHECKED_STEPS for ph in PHASES}


def config_plan(name: str) -> dict[tuple[int, str], int]:
    """The config route's plan of ``ranks_cases``' causal LM from its Hugging Face config."""
    from ranks_cases import CASES, HF_BATCH, HF_SEQ, HF_VOCAB

    from gpuwatch.predict import Plan, rank_estimate, shape_from_config, total

    config = {
        "model_type": "llama",
        "vocab_size": HF_VOCAB,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": HF_SEQ,
        "tie_word_embeddings": False,
    }
    shape = shape_from_config(config, None).shape
    plan = Plan(
        shape,
        batch=HF_BATCH,
        seq=HF_SEQ,
        precision="fp32",
        impl="for-loop",
        world=CASES[name]["world"],
        device="cpu",
        **CONFIG_CASES[name],
    )
    pred = rank_estimate(plan).prediction
    return {
        (s, ph): total(pred.phases[ph, s == 1].peak)
        for s in CHECKED_STEPS
        for ph in PHASES
        if (ph, s == 1) in pred.phases
    }


def trace_rows(result: dict[str, Any]) -> dict[tuple[int, str], int]:
    from gpuwatch.predict import total

    return {
        (s, ph): total((result["first_step"] if s == 1 else result["phases"])[ph])
        for s in CHECKED_STEPS
        for ph in PHASES
    }


# --------------------------------------------------------------------------- the truth


def _wrap(model: Any, case: dict[str, Any]) -> Any:
    import torch
    from ranks_cases import Block

    if case.get("checkpointing"):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for i in range(len(model.blocks)):
            model.blocks[i] = checkpoint_wrapper(model.blocks[i])
    layout = case["layout"]
    if layout.startswith("tp="):
        return _tensor_parallel(model)
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, init_sync=False)  # (ranks_cases: a broadcast's frees unseen)
    if layout == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu")
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {}
    if case.get("mp_policy"):  # (bf16 units, fp32 reduction)
        kw["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def _tensor_parallel(model: Any) -> Any:
    """Megatron's split of each block, written out: ``up`` by columns, ``down`` by rows."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan: dict[str, Any] = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    # src_data_rank=None: each rank cuts its shards from its own copy (one seed made them
    # equal); a scatter from rank 0 leaves frees to gloo's thread, unseen (ranks_cases).
    return parallelize_module(model, mesh, plan, src_data_rank=None)


def run_truth(case: dict[str, Any], rank: int) -> dict[str, int]:
    """Train the case on this rank (its group is up) for :data:`STEPS` steps under the
    profiler; ``{"<step>:<phase>": peak bytes}``."""
    import torch
    from profmem import ProfiledMemory

    mem = ProfiledMemory("cpu")
    mem.start()
    torch.manual_seed(0)
    model, loss_fn, x = (mlp_lora if case.get("lora") else mlp)()
    model = _wrap(model, case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    amp = case.get("precision") == "bf16-mixed"
    for step in range(1, STEPS + 1):
        for _ in range(case.get("accumulation", 1)):
            with mem.phase(step, "forward"), torch.autocast("cpu", torch.bfloat16, enabled=amp):
                loss = loss_fn(model(x))
            with mem.phase(step, "backward"):
                loss.backward()
            del loss
        with mem.phase(step, "optimizer.step"):
            opt.step()
        with mem.phase(step, "zero_grad"):
            opt.zero_grad()
    alive = None
    if case["layout"] != "ddp":
        alive = [*model.parameters(), *(p.grad for p in model.parameters()), x]
        alive += [v for st in opt.state.values() for v in st.values()]
    truth = mem.stop(alive)
    return {f"{s}:{p}": v for (s, p), v in truth.peaks.items()}


def _child(rank: int, case: dict[str, Any], world: int, store: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from profmem import settle_collectives

    torch.set_num_threads(1)
    if case["layout"] == "fsdp1":
        settle_collectives()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        got = run_truth(case, rank)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(got))


def truth_of(case: dict[str, Any]) -> list[dict[str, int]]:
    """Every rank's truth (spawned gloo ranks, or rank 0 on the fake group)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    world = case["world"]
    if case.get("fake"):
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        try:
            return [run_truth(case, 0)]
        finally:
            dist.destroy_process_group()
    with tempfile.TemporaryDirectory(prefix="gw-plan-") as tmp:
        store = os.path.join(tmp, "store")
        mp.spawn(_child, args=(case, world, store, tmp), nprocs=world, join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def hf_truth(name: str) -> list[dict[str, int]]:
    from ranks_cases import run_case

    return [r["truth"] for r in run_case(name, steps=STEPS)]


# --------------------------------------------------------------------------- the table


def _mib(n: float) -> str:
    return f"{n / 2**20:8.1f}"


def _order(row: tuple[tuple[int, str], int]) -> tuple[int, int]:
    return row[0][0], PHASES.index(row[0][1])


def compare(
    name: str,
    plan: dict[tuple[int, str], int],
    truths: list[dict[str, int]],
    anchor: dict[tuple[int, str], int],
) -> tuple[float, float]:
    """Print the rows; return the worst |ratio - 1| of the plan and of the anchor."""
    worst = anchor_worst = 0.0
    for rank, truth in enumerate(truths):
        for (step, phase), planned in sorted(
            plan.items(), key=lambda kv: (kv[0][0], PHASES.index(kv[0][1]))
        ):
            true = truth.get(f"{step}:{phase}")
            if not true:
                continue
            ratio = planned / true
            worst = max(worst, abs(ratio - 1))
            old = anchor.get((step, phase))
            shown = f"{_mib(old)} {old / true:5.2f}" if old else f"{'-':>8} {'-':>5}"
            if old:
                anchor_worst = max(anchor_worst, abs(old / true - 1))
            print(
                f"{name:24} {rank:4} {step:4} {phase:15} {_mib(true)} {_mib(planned)}"
                f" {ratio:5.2f}  {shown}"
            )
    return worst, anchor_worst


def run_trace_case(name: str) -> str:
    case = TRACE_CASES[name]
    if case.get("zero"):
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            return "SKIP (deepspeed not installed)"
    t0 = time.monotonic()
    result = trace_plan(case)
    planned_s = time.monotonic() - t0
    if "refused" in result:
        said = f"REFUSED in one line: {result['refused']}"
        return said if case.get("refused") else f"{said} FAIL"
    plan = trace_rows(result)
    anchor = anchor_plan({k: v for k, v in case.items() if k != "mp_policy"})
    worst, anchor_worst = compare(f"trace:{name}", plan, truth_of(case), anchor)
    verdict = "PASS" if worst <= TOLERANCE else "FAIL"
    return (
        f"worst phase {worst:.1%} off (anchor, the old --trace: {anchor_worst:.1%});"
        f" planned in {planned_s:.1f} s {verdict}"
    )


def run_config_case(name: str) -> str:
    from ranks_cases import CASES

    if CASES[name]["layout"] == "zero":
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            return "SKIP (deepspeed not installed)"
    plan = config_plan(name)
    worst, _ = compare(f"config:{name}", plan, hf_truth(name), {})
    return f"worst phase {worst:.1%} off {'PASS' if worst <= TOLERANCE else 'FAIL'}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("cases", nargs="*", help="trace cases by name, config cases as config:NAME")
    args = parser.parse_args(argv)
    names = args.cases or (
        QUICK if args.quick else [*TRACE_CASES, *(f"config:{n}" for n in CONFIG_CASES)]
    )
    print(f"{'case':24} rank step {'phase':15} {'truth':>8} {'plan':>8} ratio  {'anchor':>8} ratio")
    verdicts = {}
    for name in names:
        if name.startswith("config:"):
            verdicts[name] = run_config_case(name.partition(":")[2])
        else:
            verdicts[name] = run_trace_case(name)
        print(f"{name}: {verdicts[name]}", flush=True)
    print()
    for name, verdict in verdicts.items():
        print(f"{name:28} {verdict}")
    failed = [n for n, v in verdicts.items() if v.endswith("FAIL")]
    print("FAIL" if failed else "PASS", f"({len(failed)} of {len(verdicts)} cases failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
