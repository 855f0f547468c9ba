"""A ``gpuwatch estimate --trace`` entry point for the tiny GPT of ``train_tiny_gpt.py``.

    python -m gpuwatch estimate --trace samples/trace_tiny_gpt.py:build

``build()`` runs under PyTorch's FakeTensorMode, so every tensor it makes has a shape and a
dtype but no memory: the same function can describe a model far larger than the machine.
It returns ``(model, optimizer, batch)``; ``model(*batch)`` returns the loss.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tiny_gpt import TinyGPT


def build(
    vocab: int = 512, seq: int = 64, layers: int = 2, hidden: int = 64, heads: int = 4
) -> tuple[torch.nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, torch.Tensor]]:
    """The sample's model, its AdamW and one batch of 8 sequences."""
    model = TinyGPT(vocab, seq, layers, hidden, heads, "sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    tokens = torch.randint(0, vocab, (8, seq + 1))
    return model, opt, (tokens[:, :-1], tokens[:, 1:])
