"""The facts vocabulary: the second wire contract, beside :mod:`gpuwatch.protocol`.

A training process reads its model and optimizer once and sends *facts* (``docs/facts.md``);
the dashboard predicts memory from them, and a recording keeps them so that a replay is
predicted anew. Both sides agree on the names here: the schema's version, its limits, and
the attribute and module names by which facts are read from a model (Hugging Face configs,
Megatron, nanoGPT and LLaMA-style code), which ``gpuwatch estimate`` reads from a config
file too. Standard library only: the training side imports this.
"""

from __future__ import annotations

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
