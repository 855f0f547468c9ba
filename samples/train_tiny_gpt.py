"""A real, small GPT trained with AdamW on random tokens, instrumented with gpuwatch phases.

Runs on the CPU in seconds and on CUDA when present::

    python samples/train_tiny_gpt.py --steps 20
    gpuwatch run -- python samples/train_tiny_gpt.py --steps 200   # watch it live

Phases: data, forward, backward, optimizer.step, zero_grad, and eval every few steps;
``gpuwatch.watch`` sends the model's facts so the dashboard can predict its memory.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import gpuwatch


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4h GELU MLP."""

    def __init__(self, hidden: int, heads: int, attention: str) -> None:
        super().__init__()
        self.heads = heads
        self.attention = attention
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """GPT-2 shaped: token and position embeddings, blocks, final norm, tied LM head."""

    def __init__(
        self,
        vocab: int,
        seq: int,
        layers: int,
        hidden: int,
        heads: int,
        attention: str = "sdpa",
        checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                # Keeps only the block's input; backward runs the block again.
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument(
        "--checkpointing", action="store_true", help="checkpoint every block (non-reentrant)"
    )
    p.add_argument("--eval-every", type=int, default=10, help="eval every N steps (0: never)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--foreach",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="AdamW's foreach implementation (default on)",
    )
    p.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        help="seconds to sleep after each step, to slow the run for watching",
    )
    p.add_argument(
        "--oom-at",
        type=int,
        default=None,
        help="at this step, run one forward with a batch far too large (OOM demo)",
    )
    p.add_argument(
        "--log-every", type=int, default=0, help="print the loss every N steps (0: only at the end)"
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = TinyGPT(
        args.vocab,
        args.seq,
        args.layers,
        args.hidden,
        args.heads,
        args.attention,
        args.checkpointing,
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=args.foreach)
    # Model facts for the predicted line and the breakdown bar. The phases below are
    # written out by hand to show the API; watch() alone would infer them (phases=True).
    gpuwatch.watch(model, opt, phases=False, checkpointing=args.checkpointing or None)
    gpuwatch.mark(f"start: {sum(p.numel() for p in model.parameters())} parameters")

    def batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        with gpuwatch.phase("data"):
            tokens = torch.randint(0, args.vocab, (b, args.seq + 1), device=device)
            return tokens[:, :-1], tokens[:, 1:]

    t_start = time.monotonic()
    for step in range(args.steps):
        gpuwatch.step(step)
        x, y = batch(args.batch)
        if args.oom_at is not None and step == args.oom_at:
            try:
                big_x, big_y = batch(args.batch * 4096)
                with gpuwatch.phase("forward"):
                    model(big_x, big_y)
            except torch.OutOfMemoryError:
                gpuwatch.mark("caught an OOM, continuing with the normal batch", "error")
                del big_x, big_y
        with gpuwatch.phase("forward"):
            loss = model(x, y)
        with gpuwatch.phase("backward"):
            loss.backward()
        with gpuwatch.phase("optimizer.step"):
            opt.step()
        with gpuwatch.phase("zero_grad"):
            opt.zero_grad(set_to_none=True)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            with gpuwatch.phase("eval"), torch.no_grad():
                ex, ey = batch(args.batch)
                eval_loss = model(ex, ey).item()
            # The step gpuwatch shows (counted from 0), so the mark does not say another.
            gpuwatch.mark(f"step {step}: loss {loss.item():.3f}, eval {eval_loss:.3f}")
        if args.log_every and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}: loss {loss.item():.3f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    elapsed = time.monotonic() - t_start
    print(f"{args.steps} steps in {elapsed:.2f}s, final loss {loss.item():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
