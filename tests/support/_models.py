"""Small transformer models for the predictor's accuracy tests, written the way the
libraries people train with write them, so that what they save for backward is what real
models save.

- :class:`GPT` follows Hugging Face's GPT-2 (``modeling_gpt2.py``) and nanoGPT: learned
  positions, pre-norm LayerNorm, fused QKV, a 4h MLP with ``gelu`` (tanh approximation as
  one op), dropout, a tied LM head. It has no ``config`` attribute, so the facts reader must
  find its shape in the module tree.
- :class:`Llama` follows Hugging Face's ``modeling_llama.py``: RMSNorm computed in fp32,
  rotary embeddings, grouped KV heads given to SDPA as they are (``enable_gqa``) and
  expanded by ``repeat_kv`` for eager attention, a SwiGLU MLP, an untied LM
  head, and an HF-style ``config``. ``lora(model, r)`` wraps ``q_proj`` and ``v_proj`` the
  way PEFT's ``LoraConfig`` defaults do for LLaMA.

Both return the loss from ``forward(idx, targets)``, computed like HF's ``ForCausalLMLoss``:
logits upcast to fp32, then cross entropy.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


class _Checkpointable(nn.Module):
    """Runs its ``layers`` with ``torch.utils.checkpoint`` when ``gradient_checkpointing``."""

    gradient_checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self.gradient_checkpointing = True

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.gradient_checkpointing

    def run_layers(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, *extra, use_reentrant=False)
            else:
                x = layer(x, *extra)
        return x


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # HF ForCausalLMLoss: upcast to fp32 before cross entropy.
    logits = logits.float()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class GPTAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, attention: str, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention = attention
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            p = self.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = self.attn_dropout(att) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, s, h)))


class GPTMLP(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, attention: str, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = GPTAttention(hidden, heads, attention, dropout)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = GPTMLP(hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(_Checkpointable):
    """GPT-2 shaped decoder with a tied head (no ``config``: found from the module tree)."""

    def __init__(
        self,
        vocab: int = 1024,
        seq: int = 128,
        layers: int = 2,
        hidden: int = 128,
        heads: int = 4,
        attention: str = "eager",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            GPTBlock(hidden, heads, attention, dropout) for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        x = self.run_layers(x)
        return _loss(self.lm_head(self.ln_f(x)), targets)


class LlamaRMSNorm(nn.Module):
    """HF's LlamaRMSNorm: computed in fp32, cast back, then scaled."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class LoraLinear(nn.Module):
    """PEFT's ``lora.Linear``: a frozen base plus ``B(A(x)) * alpha / r``."""

    def __init__(self, base: nn.Linear, r: int, alpha: float = 16.0) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


class LlamaAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, attention: str) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attention = attention
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q = self.q_proj(x).view(b, s, -1, d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        n_rep = self.heads // self.kv_heads
        if self.attention == "sdpa":
            # transformers 5 (``use_gqa_in_sdpa``: no padding mask) gives SDPA the grouped
            # K/V as they are: no copy at the full head count.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1)
        else:
            k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
            att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
            mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
            att = F.softmax(att + mask, dim=-1, dtype=torch.float32).to(q.dtype)
            y = torch.matmul(att, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv: int, inter: int, attention: str) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(hidden)
        self.self_attn = LlamaAttention(hidden, heads, kv, attention)
        self.post_attention_layernorm = LlamaRMSNorm(hidden)
        self.mlp = LlamaMLP(hidden, inter)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(_Checkpointable):
    """LLaMA shaped decoder with an HF-style ``config``."""

    def __init__(
        self,
        vocab: int = 1024,
        layers: int = 2,
        hidden: int = 128,
        heads: int = 4,
        kv_heads: int = 2,
        intermediate: int = 352,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.config = SimpleNamespace(
            model_type="llama",
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=intermediate,
            vocab_size=vocab,
            hidden_act="silu",
            attention_dropout=0.0,
            tie_word_embeddings=False,
            _attn_implementation=attention,
        )
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            LlamaLayer(hidden, heads, kv_heads, intermediate, attention) for _ in range(layers)
        )
        self.norm = LlamaRMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        d = hidden // heads
        self.register_buffer(
            "inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)), persistent=False
        )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        pos = torch.arange(idx.size(1), device=idx.device).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        x = self.run_layers(x, cos, sin)
        return _loss(self.lm_head(self.norm(x)), targets)


def lora(model: Llama, r: int = 8) -> Llama:
    """Freeze everything, then add LoRA adapters to every ``q_proj`` and ``v_proj``."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.layers:
        attn = layer.self_attn
        attn.q_proj = LoraLinear(attn.q_proj, r)
        attn.v_proj = LoraLinear(attn.v_proj, r)
    return model
