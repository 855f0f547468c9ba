"""One rank of a data-parallel or sharded training run on the CPU, under the profiler truth.

Each case trains a 12-block MLP with AdamW and ``clip_grad_norm_`` for a few steps in a
layout (DDP, FSDP2 ``fully_shard``, DeepSpeed ZeRO 1-3 where ``deepspeed`` is installed),
with ``gpuwatch.watch`` describing it as a user's
script would; the allocator's events (``profmem``) give each phase's true peak on this
rank, and the facts gpuwatch would send are read back from the client. Ranks run as real
processes (``torch.multiprocessing`` spawn, gloo over a file store), or as one rank of a
larger job through torch's fake process group (``world_size`` 8 in one process).

Used by ``tests/predict/test_ranks.py`` and ``benchmarks/bench_ranks.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import profmem  # noqa: E402
from profmem import ProfiledMemory, settle_collectives  # noqa: E402

DIM, BLOCKS, BATCH, STEPS = 1024, 12, 64, 3
LORA_RANK = 8
HF_VOCAB, HF_BATCH, HF_SEQ = 8192, 4, 128
HF_WIDE = 4 * 688
"""The wide cases' MLP inner size."""

CASES = {
    "ddp": {"layout": "ddp", "world": 2},
    "ddp-view": {"layout": "ddp", "world": 2, "gradient_as_bucket_view": True},
    "fsdp2": {"layout": "fsdp2", "world": 2},
    "fsdp2-noreshard": {"layout": "fsdp2", "world": 2, "reshard_after_forward": False},
    "fsdp2-4": {"layout": "fsdp2", "world": 4},
    "fsdp2-fake8": {"layout": "fsdp2", "world": 8, "fake": True},
    # fully_shard as Hugging Face's and torchtitan's examples call it: the policy's own
    # reshard_after_forward (the root keeps its parameters from forward to backward).
    "fsdp2-hf": {"layout": "fsdp2", "world": 2, "model": "hf", "reshard_after_forward": None},
    # The same causal LM as `gpuwatch estimate --layout ddp` or `fsdp` plans it from its
    # config alone (tests/predict/test_plan_vs_run.py): rank 0 of eight, and DDP.
    "fsdp2-hf-fake8": {
        "layout": "fsdp2",
        "world": 8,
        "fake": True,
        "model": "hf",
        "reshard_after_forward": None,
    },
    "ddp-hf": {"layout": "ddp", "world": 2, "model": "hf"},
    # Activation checkpointing of every 2nd layer (torchtitan's ac_freq 2: layers 2 and
    # 4 of 4), as `estimate --checkpoint-every 2` plans it.
    "fsdp2-hf-fake8-ckpt2": {
        "layout": "fsdp2",
        "world": 8,
        "fake": True,
        "model": "hf",
        "reshard_after_forward": None,
        "checkpoint_every": 2,
    },
    # The causal LM with LoRA on q and v (PEFT's default targets), as `estimate --layout
    # fsdp --lora-rank 8` plans it: the base frozen, the adapters in the same units.
    "fsdp2-hf-lora": {
        "layout": "fsdp2",
        "world": 2,
        "model": "hf",
        "lora": LORA_RANK,
        "reshard_after_forward": None,
    },
    # Megatron's split of the causal LM over two ranks (torch's parallelize_module):
    # q/k/v and gate/up by columns, o and down by rows, the embedding and the logits by
    # vocabulary with a vocabulary-parallel loss (loss_parallel), as `--layout tp=2`.
    "tp-hf": {"layout": "tp", "world": 2, "model": "hf"},
    # DeepSpeed ZeRO-2 of the causal LM with DeepSpeed's own bucket defaults, as
    # `--layout zero2` plans it.
    "zero2-hf": {"layout": "zero", "world": 2, "stage": 2, "model": "hf", "ds_defaults": True},
    # LoRA: the blocks' Linear layers frozen, a rank-8 adapter trained beside each up
    # projection; the units gather the frozen base but reduce only the adapters.
    "fsdp2-lora": {"layout": "fsdp2", "world": 2, "lora": LORA_RANK},
    "fsdp2-lora-fake8": {"layout": "fsdp2", "world": 8, "fake": True, "lora": LORA_RANK},
    # FSDP1 (FullyShardedDataParallel), each block a unit (ModuleWrapPolicy).
    "fsdp1": {"layout": "fsdp1", "world": 2, "strategy": "FULL_SHARD"},
    "fsdp1-grad-op": {"layout": "fsdp1", "world": 2, "strategy": "SHARD_GRAD_OP"},
    # torchtitan's pattern: one unit of several modules, fully_shard([norm, output]).
    "fsdp2-shared-unit": {"layout": "fsdp2", "world": 2, "head": True},
    # DeepSpeed ZeRO through deepspeed.initialize (where deepspeed is installed): the
    # engine steps AdamW (torch's) on this rank's partition; small buckets so that they
    # are neither nothing nor the whole model.
    "zero1": {"layout": "zero", "world": 2, "stage": 1},
    "zero2": {"layout": "zero", "world": 2, "stage": 2},
    "zero2-overlap": {"layout": "zero", "world": 2, "stage": 2, "overlap_comm": True},
    "zero3": {"layout": "zero", "world": 2, "stage": 3},
    # Issue 52's layouts the planner got wrong. LoRA on q and v of a causal LM whose
    # frozen MLP is wide (intermediate 4 x 688): the gathered units dwarf the adapters.
    "fsdp2-hf-lora-wide": {
        "layout": "fsdp2",
        "world": 2,
        "model": "hf",
        "lora": LORA_RANK,
        "wide": True,
        "reshard_after_forward": None,
    },
    # Tied embedding, the loss computed outside the model with the usual shift
    # (``logits[:, :-1]``, made contiguous: a copy of the logits).
    "fsdp2-hf-tied-outside": {
        "layout": "fsdp2",
        "world": 2,
        "model": "hf",
        "tied": True,
        "loss": "outside",
        "reshard_after_forward": None,
    },
    # torchtitan's units: the embedding, each layer, and [norm, head] resharded after
    # forward, around the root; rank 0 of eight.
    "fsdp2-hf-fake8-units": {
        "layout": "fsdp2",
        "world": 8,
        "fake": True,
        "model": "hf",
        "units": "embed,layers,[norm,head]",
        "reshard_after_forward": True,
    },
    # LoRA on a frozen fp32 base under bf16 autocast, one process (no layout).
    "hf-lora-autocast": {
        "layout": "none",
        "world": 1,
        "fake": True,
        "model": "hf",
        "lora": LORA_RANK,
        "autocast": True,
    },
}
"""Name -> how the case is run (``layout``, ``world``, and the layout's options)."""

SETTLED = ("zero", "fsdp1")
"""The layouts whose collectives wait for gloo's worker to let go of their tensors, and
mark where the works' own temporaries go (``profmem.settle_collectives``): ZeRO's
all-gather buffers and initial broadcasts, and the copy of its input FSDP1's
reduce-scatter makes (gloo's ``_reduce_scatter_base``), were otherwise freed on gloo's
thread at random, unseen by the profiler, and the truth kept them (ZeRO-3 read 0.80-0.96,
FSDP1's first backward 0.89 on one run in several)."""

PHASE_ORDER = ("forward", "backward", "clip", "optimizer.step", "zero_grad")

ZERO_BUCKET = 1 << 20
"""``reduce_bucket_size`` and ``allgather_bucket_size`` of the ZeRO cases (elements)."""


class Block(nn.Module):
    """Two square Linear layers; with ``lora`` > 0 both frozen and a rank-``lora`` adapter
    (``lora_a`` then ``lora_b``, trained) added to the up projection."""

    def __init__(self, dim: int, lora: int = 0) -> None:
        super().__init__()
        self.up = nn.Linear(dim, dim)
        self.down = nn.Linear(dim, dim)
        self.lora_a = self.lora_b = None
        if lora:
            for p in self.parameters():
                p.requires_grad_(False)
            self.lora_a = nn.Linear(dim, lora, bias=False)
            self.lora_b = nn.Linear(lora, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.lora_a is not None and self.lora_b is not None:
            h = h + self.lora_b(self.lora_a(x))
        return x + self.down(torch.relu(h))


class MLP(nn.Module):
    """Residual blocks of two square Linear layers: 25.2 M parameters in 12 blocks at 1024.

    Twelve blocks rather than a few: gloo's thread frees a unit's reduce-scatter input
    when it gets to it, so the truth of a backward moves by one unit's gradients from
    run to run; against twelve units' states that is a few percent, not ten."""

    def __init__(
        self, dim: int = DIM, blocks: int = BLOCKS, lora: int = 0, head: bool = False
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, lora) for _ in range(blocks))
        # A final norm and output layer (``head``), as a transformer ends.
        self.norm = nn.LayerNorm(dim) if head else None
        self.output = nn.Linear(dim, dim) if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        if self.norm is not None and self.output is not None:
            x = self.output(self.norm(x))
        return x


class LoraLinear(nn.Module):
    """PEFT's ``lora.Linear`` written out (peft is not a dependency): the frozen base
    layer plus ``lora_B(lora_A(x)) * scaling``, B starting at zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: int = 16) -> None:
        super().__init__()
        self.base_layer = base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def _hf_model(lora: int = 0, wide: bool = False, tied: bool = False) -> nn.Module:
    """A small Llama-style causal LM from Hugging Face transformers (built from a config);
    with ``lora`` > 0 frozen, with rank-``lora`` adapters on q and v; ``wide``: an MLP four
    times as wide; ``tied``: the head shares the embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=HF_VOCAB,
        hidden_size=256,
        intermediate_size=HF_WIDE if wide else 688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=HF_SEQ,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config)
    if lora:
        model.requires_grad_(False)
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj = LoraLinear(attn.q_proj, lora)
            attn.v_proj = LoraLinear(attn.v_proj, lora)
    return model


def _units(model: nn.Module) -> list[nn.Module]:
    """The modules each sharded as one FSDP unit (before the root)."""
    if hasattr(model, "blocks"):
        return list(model.blocks)
    return list(model.model.layers)


def _loss(model: nn.Module, x: torch.Tensor, case: dict[str, Any]) -> torch.Tensor:
    if case["layout"] == "tp":
        # HF's ForCausalLMLoss (labels shifted by padding, -100 ignored) on logits sharded
        # by vocabulary: the loss_parallel context is also entered around backward.
        from torch.distributed.tensor.parallel import loss_parallel

        logits = model.lm_head(model.model(input_ids=x).last_hidden_state)
        labels = nn.functional.pad(x, (0, 1), value=-100)[..., 1:]
        with loss_parallel():
            return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    if case.get("autocast"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _plain_loss(model, x, case)
    return _plain_loss(model, x, case)


def _plain_loss(model: nn.Module, x: torch.Tensor, case: dict[str, Any]) -> torch.Tensor:
    if case.get("loss") == "outside":
        # The usual loss outside the model: the logits shifted by one and made contiguous.
        logits = model(input_ids=x).logits
        shifted = logits[:, :-1].contiguous()
        return nn.functional.cross_entropy(shifted.flatten(0, 1), x[:, 1:].flatten())
    if case.get("model") == "hf":
        return model(input_ids=x, labels=x).loss
    return model(x).square().mean()


def _batch(case: dict[str, Any], rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rank)
    if case.get("model") == "hf":
        return torch.randint(0, HF_VOCAB, (HF_BATCH, HF_SEQ), generator=gen)
    return torch.randn(BATCH, DIM, generator=gen)


def _tensor_parallel(model: nn.Module) -> nn.Module:
    """Megatron's split of the causal LM over the process group (one CPU mesh)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    for i in range(len(model.model.layers)):
        for name in ("q_proj", "k_proj", "v_proj"):
            plan[f"model.layers.{i}.self_attn.{name}"] = ColwiseParallel()
        plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        for name in ("gate_proj", "up_proj"):
            plan[f"model.layers.{i}.mlp.{name}"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    # src_data_rank=None: each rank cuts its shards from its own copy (the same seed made
    # them equal). Scattering from rank 0 instead leaves the full tensors' frees to gloo's
    # thread, which the profiler does not see: rank 0's truth then held 8 MiB more, or not.
    return parallelize_module(model, mesh, plan, src_data_rank=None)


def _wrap(model: nn.Module, case: dict[str, Any]) -> nn.Module:
    if case["layout"] == "tp":
        return _tensor_parallel(model)
    if case["layout"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # init_sync=False: every rank built the same weights from one seed, and the
        # broadcast that would make them equal frees its coalesced buffers on gloo's
        # thread at random, unseen by the profiler: a rank's truth then held a copy of the
        # model for the whole run (every phase of rank 1 read 0.75-0.89 in one run of six).
        return DDP(
            model,
            gradient_as_bucket_view=case.get("gradient_as_bucket_view", False),
            init_sync=False,
        )
    if case["layout"] == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            sharding_strategy=ShardingStrategy[case["strategy"]],
            device_id=torch.device("cpu"),  # without it FSDP1 asks for an accelerator
        )
    if case["layout"] == "none":
        return model
    from torch.distributed.fsdp import fully_shard

    reshard = case.get("reshard_after_forward", True)
    kw = {} if reshard is None else {"reshard_after_forward": reshard}
    if case.get("units"):  # the embedding, each layer, and [norm, head]
        fully_shard(model.model.embed_tokens, **kw)
    for unit in _units(model):
        fully_shard(unit, **kw)
    if case.get("units"):
        fully_shard([model.model.norm, model.lm_head], **kw)
    if case.get("head"):
        fully_shard([model.norm, model.output], **kw)
    fully_shard(model, **kw)
    return model


def _model(case: dict[str, Any]) -> nn.Module:
    if case.get("model") == "hf":
        model = _hf_model(case.get("lora", 0), bool(case.get("wide")), bool(case.get("tied")))
        every = case.get("checkpoint_every")
        if every:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper,
            )

            layers = model.model.layers
            for i in range(len(layers)):
                if (i + 1) % every == 0:  # torchtitan's count: the k-th, 2k-th, ...
                    layers[i] = checkpoint_wrapper(layers[i])
        return model
    return MLP(lora=case.get("lora", 0), head=bool(case.get("head")))


def _deepspeed(model: nn.Module, case: dict[str, Any]) -> tuple[Any, Any]:
    """``deepspeed.initialize`` on the CPU over the process group already up (gloo).

    DeepSpeed's CPU accelerator JIT-builds a shared-memory all-reduce op when its comm
    backend starts (``deepspeed/comm/torch.py``, ``build_shm_op``): minutes of C++ on a
    small machine, and a hang behind a lock a killed build leaves. Marking the op
    incompatible, as DeepSpeed does on platforms without it, keeps gloo's own collectives.
    """
    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # What a launcher sets and deepspeed.initialize asserts (one host: local = global).
    os.environ["LOCAL_RANK"] = os.environ["RANK"] = str(dist.get_rank())
    os.environ["WORLD_SIZE"] = str(dist.get_world_size())
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    zero: dict[str, Any] = {"stage": case["stage"]}
    if not case.get("ds_defaults"):
        zero.update(
            {
                "reduce_bucket_size": ZERO_BUCKET,
                "allgather_bucket_size": ZERO_BUCKET,
                "overlap_comm": bool(case.get("overlap_comm", False)),
                "stage3_prefetch_bucket_size": ZERO_BUCKET,
                "stage3_max_live_parameters": 4 * ZERO_BUCKET,
            }
        )
    config = {
        "train_micro_batch_size_per_gpu": HF_BATCH if case.get("model") == "hf" else BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
    }
    engine, opt, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    return engine, opt


def _held() -> list[torch.Tensor]:
    """Every tensor Python still holds, with the leaves' gradients: what DeepSpeed keeps
    (partitions, master copy, buckets, gathered parameters) cannot be named one by one,
    and what gloo's thread frees (an all-gather's flat output, once its parameters are
    released) is among none of them (``profmem``'s orphans)."""
    import gc

    out = []
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor):
            out.append(o)
            if o.is_leaf and o.grad is not None:
                out.append(o.grad)
    return out


def _run_zero(name: str, rank: int, steps: int) -> dict[str, Any]:
    """A ZeRO case: forward, ``engine.backward`` and ``engine.step`` (which clips and
    zeroes the gradients itself) under the profiler."""
    import gpuwatch
    from gpuwatch.instrument import _api

    case = CASES[name]
    mem = ProfiledMemory("cpu")
    mem.start()
    torch.manual_seed(0)
    engine, opt = _deepspeed(_model(case), case)
    gpuwatch.watch(engine, opt)
    x = _batch(case, rank)
    for step in range(1, steps + 1):
        with mem.phase(step, "forward"):
            loss = _loss(engine, x, case)
        with mem.phase(step, "backward"):
            engine.backward(loss)
        with mem.phase(step, "optimizer.step"):
            engine.step()
        del loss
    truth = mem.stop(_held())
    return {
        "rank": rank,
        "facts": _api._state.client.facts,
        "truth": {f"{s}:{p}": v for (s, p), v in truth.peaks.items()},
        "orphan_bytes": truth.orphan_bytes,
        "unsettled": profmem.unsettled,
    }


def run_rank(name: str, rank: int, steps: int = STEPS) -> dict[str, Any]:
    """Train ``steps`` steps of case ``name`` on this rank (its process group is up).

    Returns:
        ``{"facts": ..., "truth": {"<step>:<phase>": peak bytes}}``.
    """
    import gpuwatch
    from gpuwatch.instrument import _api

    case = CASES[name]
    if case["layout"] == "zero":
        return _run_zero(name, rank, steps)
    mem = ProfiledMemory("cpu")
    mem.start()
    torch.manual_seed(0)
    model = _wrap(_model(case), case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    gpuwatch.watch(model, opt)
    x = _batch(case, rank)
    for step in range(1, steps + 1):
        with mem.phase(step, "forward"):
            loss = _loss(model, x, case)
        with mem.phase(step, "backward"):
            if case["layout"] == "tp":
                from torch.distributed.tensor.parallel import loss_parallel

                with loss_parallel():
                    loss.backward()
            else:
                loss.backward()
        if case["layout"] != "tp":
            # (clip_grad_norm_ cannot stack the DTensor and plain norms of a TP model.)
            with mem.phase(step, "clip"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with mem.phase(step, "optimizer.step"):
            opt.step()
        with mem.phase(step, "zero_grad"):
            opt.zero_grad()
        del loss
    alive = None
    if case["layout"] in ("fsdp1", "fsdp2", "tp"):
        # FSDP2's collective buffers, and the inputs of tensor parallel's all-reduces,
        # can be freed on gloo's thread (orphans, profmem); DDP's keep their buckets
        # (rebuilt in step 2), which we cannot name, and free nothing there.
        alive = [*model.parameters(), *(p.grad for p in model.parameters()), x]
        alive += [v for st in opt.state.values() for v in st.values()]
    truth = mem.stop(alive)
    facts = _api._state.client.facts
    return {
        "rank": rank,
        "facts": facts,
        "truth": {f"{s}:{p}": v for (s, p), v in truth.peaks.items()},
        "orphan_bytes": truth.orphan_bytes,
        "unsettled": profmem.unsettled,
    }


def _child(rank: int, name: str, world: int, store: str, out: str, steps: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    if CASES[name]["layout"] in SETTLED:
        settle_collectives()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        got = run_rank(name, rank, steps)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(got))


CASE_TIMEOUT = 900.0
"""Seconds a case's ranks may take before the pool is torn down and the case fails."""


class _Pool:
    """``world`` rank processes that run case after case, each in a process group of its
    own: a spawned rank spends most of a small case importing torch and ``torch._dynamo``
    (DDP and FSDP import it), so the ranks outlive their case. A pool runs either the
    :data:`SETTLED` layouts or the others, never both: settling wraps the collectives for
    good."""

    def __init__(self, world: int) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.done = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.procs = [
            ctx.Process(target=_serve, args=(r, world, self.jobs[r], self.done), daemon=True)
            for r in range(world)
        ]
        for proc in self.procs:
            proc.start()

    def run(self, name: str, steps: int) -> list[dict[str, Any]]:
        import queue
        import time

        with tempfile.TemporaryDirectory(prefix="gw-ranks-") as tmp:
            for q in self.jobs:
                q.put((name, steps, os.path.join(tmp, "store"), tmp))
            left = len(self.procs)
            deadline = time.monotonic() + CASE_TIMEOUT
            while left:
                try:
                    _, error = self.done.get(timeout=1.0)
                except queue.Empty:
                    if time.monotonic() > deadline or not all(p.is_alive() for p in self.procs):
                        raise RuntimeError(f"case {name}: a rank died or hung") from None
                    continue
                if error:  # the other ranks may wait in a collective for it: no use waiting
                    raise RuntimeError(f"case {name}:\n{error}")
                left -= 1
            world = len(self.procs)
            return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]

    def stop(self) -> None:
        """Ask the ranks to end (they take seconds to unload torch: see :meth:`close`)."""
        for q in self.jobs:
            q.put(None)

    def close(self) -> None:
        self.stop()
        self.join()

    def join(self) -> None:
        """Wait for the ranks :meth:`stop` ended (a hung one is killed)."""
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


_pools: dict[tuple[int, bool], _Pool] = {}


def close_pools() -> None:
    """End the rank processes :func:`run_case` keeps (each holds torch in memory)."""
    pools = list(_pools.values())
    _pools.clear()
    for pool in pools:  # every pool's ranks unload at once
        pool.stop()
    for pool in pools:
        pool.join()


def _serve(rank: int, world: int, jobs: Any, done: Any) -> None:
    """A pooled rank: run each case put to it, until ``None``."""
    import traceback

    while (job := jobs.get()) is not None:
        name, steps, store, out = job
        try:
            _child(rank, name, world, store, out, steps)
            done.put((rank, ""))
        except BaseException:  # the parent fails the case with it; the rank serves on
            done.put((rank, f"rank {rank}: {traceback.format_exc()}"))


def run_case(name: str, steps: int = STEPS) -> list[dict[str, Any]]:
    """Every rank's result for case ``name`` (pooled rank processes, or the fake group)."""
    import atexit

    case = CASES[name]
    world = case["world"]
    if case.get("fake"):
        return [_fake(name, world, steps)]
    key = (world, case["layout"] in SETTLED)
    if key not in _pools:
        if not _pools:
            atexit.register(close_pools)
        _pools[key] = _Pool(world)
    try:
        return _pools[key].run(name, steps)
    except BaseException:
        _pools.pop(key).close()  # a rank that failed may hold a broken group
        raise


def _fake(name: str, world: int, steps: int) -> dict[str, Any]:
    """Rank 0 of a ``world``-rank job in this process, through the fake process group."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        return run_rank(name, 0, steps)
    finally:
        dist.destroy_process_group()


def table(result: dict[str, Any]) -> list[tuple[int, str, int, int]]:
    """``(step, phase, truth, predicted)`` for each phase the predictor knows."""
    from gpuwatch.predict import predict, total

    p = predict(result["facts"])
    rows = []
    for key, truth in result["truth"].items():
        step_s, _, phase = key.partition(":")
        step = int(step_s)
        pm = p.phases.get((phase, step == 1))
        if pm is not None:
            rows.append((step, phase, int(truth), total(pm.peak)))
    return sorted(rows, key=lambda r: (r[0], PHASE_ORDER.index(r[1])))


if __name__ == "__main__":
    for case_name in sys.argv[1:] or list(CASES):
        for r in run_case(case_name):
            print(case_name, r["rank"], "orphans", r["orphan_bytes"])
            for step, phase, truth, pred in table(r):
                print(
                    f"{case_name:16} {r['rank']} {step} {phase:15}"
                    f" {truth / 2**20:8.1f} {pred / 2**20:8.1f} {pred / truth:5.2f}"
                )
