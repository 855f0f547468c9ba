"""The facts vocabulary: the second wire contract, beside :mod:`gpuwatch.protocol`.

A training process reads its model and optimizer once and sends *facts* (``docs/facts.md``);
the dashboard predicts memory from them, and a recording keeps them so that a replay is
predicted anew. Both sides agree on the names here: the schema's version, its limits, and
the attribute and module names by which facts are read from a model (Hugging Face configs,
Megatron, nanoGPT and LLaMA-style code), which ``gpuwatch estimate`` reads from a config
file too. Standard library only: the training side imports this.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

FACTS_VERSION = 1
"""Version of the facts schema (``docs/facts.md``); bumped on incompatible changes."""

MAX_BUCKETS = 64
"""At most this many optimizer (group, device, dtype) buckets, to keep a datagram small."""

MAX_UNITS = 64
"""At most this many FSDP units listed one by one in the ``parallel`` facts."""

SMALL_TENSOR = 4096
"""bitsandbytes keeps 32-bit state for tensors under ``min_8bit_size`` (4096) elements."""

CONFIG_NAMES: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv"),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "max_positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
}
"""A transformer's shape by config attribute (Hugging Face's and a few other libraries'),
first match wins."""

DROPOUT_NAMES: dict[str, tuple[str, ...]] = {
    "attn": ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"),
    "resid": ("resid_pdrop", "hidden_dropout", "hidden_dropout_prob", "dropout"),
    "embd": ("embd_pdrop", "embed_dropout"),
}
"""Dropout probabilities by config attribute."""

ATTN_ATTRS = ("_attn_implementation", "attn_implementation", "attention_implementation")
"""Where a config or module names its attention kernel."""

ATTN_VALUES = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
"""The attention kernels the facts name."""

ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "q": ("q_proj", "query", "c_attn", "qkv", "qkv_proj", "query_key_value", "wqkv", "wq"),
    "k": ("k_proj", "key", "wk"),
    "v": ("v_proj", "value", "wv"),
    "o": ("o_proj", "out_proj", "dense", "wo", "proj"),
    "gate": ("gate_proj", "w1", "gate_up_proj"),
    "up": ("up_proj", "c_fc", "fc1", "w3", "dense_h_to_4h", "fc", "wi"),
    "down": ("down_proj", "fc2", "w2", "dense_4h_to_h", "wo_mlp"),
}
"""Linear layers by role, as Hugging Face, Megatron, nanoGPT and LLaMA's reference name them."""

ATTN_PARTS = ("attn", "attention", "self_attn")
"""Module names that hold attention."""

MLP_PARTS = ("mlp", "feed_forward", "ffn", "feedforward")
"""Module names that hold the MLP."""

LORA_PARTS = ("lora_A", "lora_B", "base_layer", "lora_embedding_A", "lora_embedding_B")
"""PEFT's module names around an adapted layer."""


# ---------------------------------------------------------------------- the facts, typed
# docs/facts.md is the reference for every field; these name them for the code. Every
# part is optional (total=False): a reader ignores what it does not know, and what comes
# from a socket or a recording is hostile until checked (the predictor checks each read).


class TensorGroup(TypedDict, total=False):
    """Parameters or buffers of one (dtype, device[, trainable])."""

    dtype: str
    device: str
    trainable: bool
    count: int
    bytes: int
    tensors: int


class ParamFacts(TypedDict, total=False):
    """``params``: what this rank holds (a DTensor counts its local shard)."""

    count: int
    bytes: int
    trainable_count: int
    trainable_bytes: int
    frozen_count: int
    frozen_bytes: int
    autocast_count: int
    groups: list[TensorGroup]
    meta_count: int
    meta_tensors: int


class BufferFacts(TypedDict, total=False):
    """``buffers``."""

    count: int
    bytes: int
    groups: list[TensorGroup]
    meta_count: int
    meta_tensors: int


class OptimizerBucket(TypedDict, total=False):
    """One (param group, device, dtype) bucket of ``optimizer.groups``."""

    group: int
    device: str
    dtype: str
    tensors: int
    count: int
    bytes: int
    max_tensor_bytes: int
    second_tensor_bytes: int
    loop_peak_bytes: int
    small_count: int
    factored_count: int
    vector_count: int
    weight_decay: float
    momentum: float
    nesterov: bool
    amsgrad: bool
    lr: float
    frozen_tensors: int


OptimizerFacts = TypedDict(
    "OptimizerFacts",
    {
        "class": str,
        "module": str,
        "kind": str,
        "impl": str | None,
        "impl_explicit": bool,
        "options": dict[str, Any],
        "groups": list[OptimizerBucket],
        "param_groups": int,
        "state_bytes": int,
        "state_tensors": int,
    },
    total=False,
)
"""``optimizer`` (``class`` is a keyword, hence the functional form)."""


class AmpFacts(TypedDict, total=False):
    """``amp``: the autocast dtype given to ``watch()``."""

    dtype: str | None
    source: str


class CheckpointingFacts(TypedDict, total=False):
    """``checkpointing``."""

    enabled: bool
    source: str
    every: int


class TransformerFacts(TypedDict, total=False):
    """``transformer``: the shape, from a config or the module tree."""

    source: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    attention: str
    activation: str
    norm: str
    norm_class: str
    norm_upcast: bool
    mlp: str
    fused_qkv: bool
    rope: bool
    learned_positions: bool
    tied_embeddings: bool
    bias: bool
    dropout: dict[str, float]
    trainable: dict[str, bool]
    lora: dict[str, Any]
    head: str
    head_transform: bool
    parallel_residual: bool
    softmax_fp32: bool
    image: dict[str, int]
    loss_parallel: bool
    loss: str
    expand_kv: bool
    causal_mask: bool
    shared_norm: bool
    broadcast_kv: bool
    rope_cat: bool


class BatchFacts(TypedDict, total=False):
    """``batch``: the first forward's input."""

    shape: list[int]
    dtype: str
    device: str
    batch: int
    seq: int
    autocast: str | None


class ModuleActivations(TypedDict, total=False):
    """One entry of ``activations.modules``."""

    name: str
    bytes: int
    tensors: int
    max_tensor_bytes: int
    amp_copy_bytes: int
    out_bytes: int
    grad_bytes: int
    recomputed: bool
    recompute_bytes: int


class ActivationFacts(TypedDict, total=False):
    """``activations``: what autograd saved in the first training forward, measured."""

    source: str
    bytes: int
    tensors: int
    amp_copy_bytes: int
    offloaded_bytes: int
    opaque_bytes: int
    user_hooks: bool
    until: str
    held_output_bytes: int
    loss_outside: bool
    held_step_bytes: int
    modules: list[ModuleActivations]
    forward_peak: dict[str, Any]  # bytes, saved_bytes, amp_copy_bytes, at
    loss_peak: dict[str, Any]  # bytes, saved_bytes, amp_copy_bytes: from the return to backward
    skipped: str
    error: str


class ParallelFacts(TypedDict, total=False):
    """``parallel``: how DDP, FSDP, DeepSpeed ZeRO, tensor parallelism or a device map
    divides the model."""

    strategy: str
    rank: int
    world_size: int
    ddp: dict[str, Any]
    fsdp: dict[str, Any]
    dtensor: dict[str, Any]
    devices: dict[str, int]
    zero: dict[str, Any]


class BlasFacts(TypedDict, total=False):
    """``blas``: cuBLAS's workspace of a model on CUDA."""

    workspace_bytes: int
    source: str  # torch, config or default


class Facts(TypedDict, total=False):
    """The facts of one process (``docs/facts.md``), as sent and as recorded."""

    version: int
    torch: str
    params: ParamFacts
    buffers: BufferFacts
    optimizer: OptimizerFacts
    amp: AmpFacts
    checkpointing: CheckpointingFacts
    transformer: TransformerFacts
    batch: BatchFacts
    activations: ActivationFacts
    parallel: ParallelFacts
    blas: BlasFacts
    errors: list[str]
    # The process's count of models described before this one (a notebook's re-run model
    # cell starts a new epoch: docs/facts.md, "Models one after another").
    epoch: int


def fact_int(v: Any) -> int:
    """A whole-number fact read defensively (facts may be hostile): a bool, a non-number,
    NaN or an infinity is 0 (``int(float("inf"))`` raises)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0
    if isinstance(v, float) and not math.isfinite(v):
        return 0
    return int(v)
