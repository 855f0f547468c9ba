"""The predictor against real allocations, measured on the CPU in the same test.

Each case trains a small model for two steps with torch on the CPU while a dispatch-mode
tracker counts every live tensor storage (the same mechanism as PyTorch's MemTracker,
which ``test_tracker_agrees_with_memtracker`` checks it against; MemTracker itself cannot
follow models with frozen parameters: it registers a gradient hook on every parameter).
Weights, gradients and optimizer state are walked from the model and optimizer.

Targets (issue 6): weights, gradients and optimizer state within 2%; activations within
15%; each phase's peak within 10%. Run this file as a script to print the figures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _models import GPT, Llama, lora  # noqa: E402
from livebytes import LiveBytes  # noqa: E402

from gpuwatch.instrument._facts import batch_facts, collect_facts  # noqa: E402
from gpuwatch.predict import breakdown, predict, total  # noqa: E402

BATCH, SEQ, VOCAB = 4, 64, 1024
PHASES = ("forward", "backward", "optimizer.step", "zero_grad")


def _bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st._cdata] = st.nbytes()
    return sum(seen.values())


@dataclass
class Measured:
    weights: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    activations: int = 0
    peaks: list[dict[str, int]] = field(default_factory=list)  # per step: phase -> peak


def _optimizer(model: Any, impl: str) -> Any:
    kw = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **kw[impl])


def measure(make: Callable[[], Any], impl: str, steps: int = 2) -> tuple[dict, Measured]:
    """Train ``steps`` steps; return the facts (as watch() would send them) and figures."""
    torch.manual_seed(0)
    model = make().train()
    opt = _optimizer(model, impl)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ))
    tgt = torch.randint(0, VOCAB, (BATCH, SEQ))
    facts = collect_facts(model, opt)
    facts["batch"] = batch_facts((idx, tgt), {})
    m = Measured(weights=_bytes([*model.parameters(), *model.buffers()]))
    live = LiveBytes()
    for t in (*model.parameters(), *model.buffers()):
        live.track(t)
    with live:
        for step in range(steps):
            peaks: dict[str, int] = {}

            def phase(name: str, fn: Callable[[], Any], peaks: dict = peaks) -> Any:
                live.peak = live.total
                out = fn()
                peaks[name] = live.peak
                return out

            before = live.total
            loss = phase("forward", lambda: model(idx, tgt))
            if step == 0:
                m.activations = live.total - before
            phase("backward", loss.backward)
            del loss
            if step == 0:
                m.gradients = _bytes(p.grad for p in model.parameters())
            phase("optimizer.step", opt.step)
            if step == 0:
                m.optimizer_state = _bytes(v for s in opt.state.values() for v in s.values())
            phase("zero_grad", lambda: opt.zero_grad(set_to_none=True))
            m.peaks.append(peaks)
    return facts, m


def _ckpt(model: Any) -> Any:
    model.gradient_checkpointing_enable()
    return model


MODELS: dict[str, Callable[[], Any]] = {
    "gpt-eager": lambda: GPT(VOCAB, SEQ, 2, 128, 4, "eager", dropout=0.1),
    "gpt-sdpa": lambda: GPT(VOCAB, SEQ, 2, 128, 4, "sdpa"),
    "llama-sdpa": lambda: Llama(VOCAB, 2, 128, 4, 2, 352, "sdpa"),
    "llama-eager": lambda: Llama(VOCAB, 2, 128, 4, 2, 352, "eager"),
    "llama-lora": lambda: lora(Llama(VOCAB, 2, 128, 4, 2, 352, "sdpa"), 8),
    "llama-checkpointing": lambda: _ckpt(Llama(VOCAB, 3, 128, 4, 2, 352, "sdpa")),
    "gpt-checkpointing": lambda: _ckpt(GPT(VOCAB, SEQ, 3, 128, 4, "eager")),
}
IMPLS = ("foreach", "fused", "for-loop")


def _err(pred: float, real: float) -> float:
    return (pred - real) / real


def compare(name: str, impl: str) -> dict[str, float]:
    """Relative errors of every figure for one case."""
    facts, m = measure(MODELS[name], impl)
    p = predict(facts)
    fwd = p.phases["forward", True]
    errs = {
        "weights": _err(fwd.start["weights"], m.weights),
        "gradients": _err(p.phases["backward", True].end["gradients"], m.gradients),
        "optimizer_state": _err(
            p.phases["optimizer.step", True].end["optimizer_state"], m.optimizer_state
        ),
        "activations": _err(total(fwd.end) - total(fwd.start), m.activations),
    }
    for step, peaks in enumerate(m.peaks):
        for ph in PHASES:
            errs[f"{ph} ({'first' if step == 0 else 'later'})"] = _err(
                total(breakdown(p, ph, first_step=step == 0)), peaks[ph]
            )
    return errs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(MODELS))
def test_prediction_matches_measurement(name: str, impl: str) -> None:
    errs = compare(name, impl)
    for key in ("weights", "gradients", "optimizer_state"):
        assert abs(errs[key]) <= 0.02, (key, errs)
    assert abs(errs["activations"]) <= 0.15, errs
    for key, e in errs.items():
        if "(" in key:  # a phase peak
            assert abs(e) <= 0.10, (key, errs)


@pytest.mark.parametrize("name", ["llama-sdpa", "llama-lora"])
def test_grouped_kv_heads_are_not_copied_for_sdpa(name: str) -> None:
    # The model gives SDPA its grouped K/V as transformers 5 does (enable_gqa), and the
    # prediction counts no repeat_kv copies: the activations agree closely, not within
    # the general tolerance only (two K/V copies a layer apart, they were 4-6% under).
    errs = compare(name, "foreach")
    assert abs(errs["activations"]) <= 0.01, errs


def test_first_step_is_higher_and_later_steps_hold_state() -> None:
    facts, m = measure(MODELS["gpt-sdpa"], "foreach", steps=3)
    p = predict(facts)
    # Measured: the first forward starts without optimizer state, later ones with it.
    assert m.peaks[1]["forward"] > m.peaks[0]["forward"]
    assert m.peaks[1]["forward"] == m.peaks[2]["forward"]
    assert total(breakdown(p, "forward", False)) > total(breakdown(p, "forward", True))
    first = breakdown(p, "optimizer.step", True)
    assert first["optimizer_state"] == p.phases["optimizer.step", True].end["optimizer_state"]
    assert p.phases["optimizer.step", True].start["optimizer_state"] == 0


def test_tracker_agrees_with_memtracker() -> None:
    """The tracker above counts what PyTorch's own MemTracker counts."""
    from torch.distributed._tools.mem_tracker import MemTracker

    results = []
    for tracker in ("live", "memtracker"):
        torch.manual_seed(0)
        model = GPT(VOCAB, SEQ, 2, 128, 4, "sdpa")
        opt = _optimizer(model, "foreach")
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        if tracker == "live":
            mode: Any = LiveBytes()
            for t in (*model.parameters(), *model.buffers()):
                mode.track(t)
        else:
            mode = MemTracker()
            mode.track_external(model, opt)
        with mode:
            loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if tracker == "live":
            results.append(mode.peak)
        else:
            snap = mode.get_tracker_snapshot("peak")
            results.append(sum(d["Total"] for d in snap.values()))
        del loss
    assert abs(results[0] - results[1]) <= 0.001 * results[1], results


if __name__ == "__main__":  # print the figures for every case
    for name in MODELS:
        for impl in IMPLS:
            errs = compare(name, impl)
            cells = " ".join(f"{k}={v * 100:+.1f}%" for k, v in errs.items())
            print(f"{name:20s} {impl:8s} {cells}")
    sys.exit(0)


@pytest.mark.parametrize("kind", ["adamw", "adam-coupled-wd"])
def test_for_loop_adam_peak_is_the_largest_neighbouring_pair(kind: str) -> None:
    """The for-loop step keeps two of one tensor while the previous one's ``denom`` is
    alive: the two largest tensors far apart cost ``2 * largest + its neighbour``, not
    ``2 * largest + second largest``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512, bias=False),  # 1 MiB, the largest
        torch.nn.Linear(512, 8, bias=False),
        torch.nn.Linear(8, 512, bias=False),
        torch.nn.Linear(512, 384, bias=False),  # 768 KiB, second, two tensors later
    )
    if kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
    else:
        opt = torch.optim.Adam(model.parameters(), weight_decay=0.1, foreach=False)
    x = torch.randn(16, 512)
    model(x).square().mean().backward()
    opt.step()  # the state exists: the second step's temporaries alone are measured
    live = LiveBytes()
    for t in (*model.parameters(), *(p.grad for p in model.parameters())):
        live.track(t)
    for s in opt.state.values():
        for v in s.values():
            live.track(v)
    with live:
        before = live.total
        opt.step()
        measured = live.peak - before
    predicted = predict(collect_facts(model, opt)).optimizer.temp
    assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)
