"""Models written the way research code writes them: nothing named the Hugging Face way.

No ``config``, attribute names no heuristic knows (``nh`` for the heads, ``blocks`` of
``Blk``, ``tok``, ``proj_out``), so the facts reader finds no transformer shape and the
predictor must use the measured activations. Each takes ``(x, y)`` and returns the loss.

- :class:`TinyLlama`: RMSNorm (``torch.nn.RMSNorm``), SwiGLU, grouped KV heads, rotary
  embeddings, SDPA, separate q/k/v projections, untied head.
- :class:`FusedGPT`: one fused ``to_qkv`` projection, LayerNorm, ReLU² MLP, eager softmax
  attention, learned positions, tied head.
- :class:`TinyMoE`: a transformer whose MLP is a router over four experts, each token sent
  to its top two (index_select / index_add_, the way small MoE repos route).
- :class:`SmallCNN`: convolutions, BatchNorm, ReLU, max-pooling, a linear classifier.
- :class:`TiedLSTM`: a two-layer LSTM language model whose head is its embedding.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn
from torch.nn import functional as F


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x[..., ::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Attn(nn.Module):
    def __init__(self, dim: int, nh: int, nkv: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, dim // nh
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, nkv * self.hd, bias=False)
        self.wv = nn.Linear(dim, nkv * self.hd, bias=False)
        self.proj_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.wq(x).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj_out(y.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.a = nn.Linear(dim, hidden, bias=False)
        self.b = nn.Linear(dim, hidden, bias=False)
        self.c = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.silu(self.a(x)) * self.b(x))


class Blk(nn.Module):
    def __init__(self, dim: int, nh: int, nkv: int, hidden: int) -> None:
        super().__init__()
        self.n1 = nn.RMSNorm(dim)
        self.att = Attn(dim, nh, nkv)
        self.n2 = nn.RMSNorm(dim)
        self.ff = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.att(self.n1(x), cos, sin)
        return x + self.ff(self.n2(x))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int = 1024, dim: int = 128, depth: int = 2, nh: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Blk(dim, nh, nh // 2, 3 * dim) for _ in range(depth))
        self.norm = nn.RMSNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        hd = dim // nh
        self.register_buffer("freqs", 1.0 / 10000 ** (torch.arange(0, hd, 2) / hd))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[1], device=x.device)[:, None] * self.freqs[None, :]
        cos, sin = t.cos(), t.sin()
        h = self.tok(x)
        for blk in self.blocks:
            h = blk(h, cos, sin)
        logits = self.out(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())


class FusedAttn(nn.Module):
    def __init__(self, dim: int, nh: int) -> None:
        super().__init__()
        self.nh = nh
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.to_qkv(x).view(b, s, 3, self.nh, d // self.nh).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.nh)
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        y = att.softmax(-1) @ v
        return self.to_out(y.transpose(1, 2).reshape(b, s, d))


class ReluSq(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)).square())


class Layer(nn.Module):
    def __init__(self, dim: int, nh: int, mix: nn.Module) -> None:
        super().__init__()
        self.ln_a = nn.LayerNorm(dim)
        self.mixer = FusedAttn(dim, nh)
        self.ln_b = nn.LayerNorm(dim)
        self.mix = mix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.ln_a(x))
        return x + self.mix(self.ln_b(x))


class FusedGPT(nn.Module):
    def __init__(
        self, vocab: int = 1024, seq: int = 64, dim: int = 128, depth: int = 2, nh: int = 4
    ) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.stack = nn.Sequential(*(Layer(dim, nh, ReluSq(dim)) for _ in range(depth)))
        self.final = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.stack(self.emb(x) + self.pos[: x.shape[1]])
        logits = self.final(h) @ self.emb.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())


class Experts(nn.Module):
    """Top-2 routing over four small MLPs, tokens gathered and scattered by index."""

    def __init__(self, dim: int, n: int = 4, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, n, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(n)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if len(rows):
                y = expert(flat.index_select(0, rows)) * weights[rows, slot, None]
                out = out.index_add(0, rows, y)
        return out.view(shape)


class TinyMoE(nn.Module):
    def __init__(
        self, vocab: int = 1024, seq: int = 64, dim: int = 128, depth: int = 2, nh: int = 4
    ) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.body = nn.ModuleList(Layer(dim, nh, Experts(dim)) for _ in range(depth))
        self.final = nn.LayerNorm(dim)
        self.unembed = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos(torch.arange(x.shape[1]))
        for layer in self.body:
            h = layer(h)
        return F.cross_entropy(self.unembed(self.final(h)).flatten(0, 1), y.flatten())


class SmallCNN(nn.Module):
    """Three conv / BatchNorm / ReLU / max-pool stages and a linear classifier."""

    def __init__(self, classes: int = 10, width: int = 32) -> None:
        super().__init__()
        chans = (3, width, 2 * width, 4 * width)
        self.features = nn.Sequential(
            *(
                part
                for cin, cout in itertools.pairwise(chans)
                for part in (
                    nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                    nn.BatchNorm2d(cout),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                )
            )
        )
        self.classifier = nn.Linear(4 * width * 4 * 4, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.classifier(self.features(x).flatten(1)), y)


class TiedLSTM(nn.Module):
    """A two-layer LSTM language model with the embedding reused as the output head."""

    def __init__(self, vocab: int = 1024, dim: int = 128, depth: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, depth, batch_first=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.tok(x))
        return F.cross_entropy((h @ self.tok.weight.t()).flatten(0, 1), y.flatten())
