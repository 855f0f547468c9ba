"""Every peak explained: info's one-liners and JSON, the Peaks tab's row, and the
per-span predictions (accumulation, zero_grad before the first step) against real
training on the CPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import synthetic
from conftest import ROOT, run_cli

from gpuwatch import predict as pr
from gpuwatch.analysis.explain import CATEGORY_KEYS, Explained, explain_breakdown, explain_line
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.tables import PeaksTable

SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"
GIB = 2**30


def test_info_explains_the_27b_optimizer_step_in_one_line() -> None:
    out = run_cli("info", str(SPIKE))
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("optimizer.step peak")]
    # 53.61 GiB = weights + gradients + AdamW state + the foreach temporary + the cuBLAS
    # workspaces (before they were a category, their 0.06 was the residual).
    assert line.strip().startswith("optimizer.step peak 53.61 GiB = weights 10.71")
    assert "AdamW state 21.42" in line
    assert "AdamW foreach temporary 10.71" in line
    assert "cuBLAS workspaces 0.06 + unexplained 0.00" in line
    # Beyond it, each figure in its own unit: the context as the bar and Peaks give it.
    assert "allocator cache 2.64 GiB" in line and "CUDA context and non-torch 751 MiB" in line


def test_info_json_holds_predicted_against_measured_per_phase() -> None:
    out = run_cli("info", "--json", str(SPIKE))
    assert out.returncode == 0, out.stderr
    (proc,) = json.loads(out.stdout)["processes"]
    predicted = proc["predicted"]
    assert set(predicted) == {"forward", "backward", "optimizer.step", "zero_grad", "eval"}
    step = predicted["optimizer.step"]
    for key in ("peak_bytes", "first_step_peak_bytes", "measured_peak_bytes"):
        assert isinstance(step[key], int)
    assert set(step["categories"]) == set(CATEGORY_KEYS)
    assert step["activations_source"] == "measured"
    assert step["temporaries"] == "AdamW foreach temporary"
    assert step["categories"]["temporaries"] == step["categories"]["weights"]  # one bucket
    for name in ("forward", "backward", "optimizer.step"):
        e = predicted[name]
        assert abs(e["peak_bytes"] - e["measured_peak_bytes"]) < 0.02 * e["measured_peak_bytes"]
        assert e["unexplained_bytes"] == e["measured_peak_bytes"] - sum(e["categories"].values())
    # The first step's forward has no optimizer state yet.
    assert predicted["forward"]["first_step_categories"]["optimizer_state"] == 0
    assert predicted["forward"]["categories"]["optimizer_state"] > 0
    assert proc["findings"] == []


def test_an_over_prediction_is_named_as_such() -> None:
    p = pr.predict(facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32))
    cats = pr.breakdown(p, "optimizer.step", False)
    total = sum(cats.values())
    parts = explain_breakdown(p, "optimizer.step", cats, total - 1000, total + 500, total + 900)
    assert [x.key for x in parts][-3:] == ["over_predicted", "cache", "context"]
    assert parts[-3].bytes == -1000 and parts[-2].bytes == 1500 and parts[-1].bytes == 400
    e = Explained("optimizer.step", False, 1, total - 1000, total, cats, parts)
    assert "over-predicted -1000 B" in explain_line(e)


def test_parts_too_small_to_matter_are_folded() -> None:
    """The 4-byte loss the loop holds is no term beside GiBs; a small line keeps its parts."""
    from gpuwatch.analysis.explain import Part

    gib = 2**30
    big = [
        Part("weights", "weights", 10 * gib),
        Part("optimizer_state", "AdamW state", 20 * gib),
        Part("activations", "activations (measured)", 4),
        Part("temporaries", "AdamW foreach temporary", 10 * gib),
    ]
    cats = {p.key: p.bytes for p in big}
    line = explain_line(Explained("optimizer.step", False, 1, None, 0, cats, big))
    assert "activations" not in line and "smaller items" not in line, line
    assert line.endswith("AdamW foreach temporary 10.00"), line
    small = [Part("weights", "weights", 500_000), Part("activations", "activations", 300_000)]
    cats = {p.key: p.bytes for p in small}
    line = explain_line(Explained("forward", False, 1, None, 0, cats, small))
    assert "weights" in line and "activations" in line, line


# --------------------------------------------------------------------------- per span


def _spans(plan: list[tuple[str, int]]) -> list[pr.Span]:
    return [pr.Span(name, 10 * i, 10 * i + 5, step) for i, (name, step) in enumerate(plan)]


def test_zero_grad_before_the_first_step_frees_nothing_and_accumulation_keeps_grads() -> None:
    facts = facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32, precision="fp32")
    p = pr.predict(facts)
    plan = [("zero_grad", 0)]  # HF's Trainer zeroes before its first step
    plan += [("forward", 0), ("backward", 0)] * 3 + [("optimizer.step", 0), ("zero_grad", 1)]
    plan += [("forward", 1), ("backward", 1)] * 3 + [("optimizer.step", 1), ("zero_grad", 2)]
    peaks = pr.span_peaks(p, _spans(plan))
    weights = p.phases["forward", True].start["weights"]
    grads = p.phases["optimizer.step", False].start["gradients"]
    first_zero = peaks[0]
    assert first_zero.first_step and pr.total(first_zero.peak) == weights
    forwards = [x for x in peaks if x.span.name == "forward"]
    assert forwards[0].peak["gradients"] == 0
    assert forwards[1].peak["gradients"] == grads == forwards[2].peak["gradients"]
    assert forwards[3].peak["gradients"] == 0 and forwards[3].peak["optimizer_state"] > 0
    later_zero = [x for x in peaks if x.span.name == "zero_grad"][1]
    assert later_zero.peak["gradients"] == grads  # what it frees


def _enable_checkpointing(model: Any) -> None:
    # Transformers 5 renamed it (the old name warns); older releases have only the old.
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)()


def _hf_bert(checkpointing: bool) -> Any:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        intermediate_size=512,
        vocab_size=1024,
        max_position_embeddings=64,
    )
    model = transformers.BertForMaskedLM(cfg).train()
    if checkpointing:
        _enable_checkpointing(model)
    return model


def _hf_gpt2(checkpointing: bool) -> Any:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=64
    )  # activation_function="gelu_new", dropout 0.1 everywhere: GPT-2's defaults
    model = transformers.GPT2LMHeadModel(cfg).train()
    if checkpointing:
        _enable_checkpointing(model)
    return model


@pytest.mark.parametrize(
    ("make", "checkpointing", "accum"),
    [(_hf_bert, True, 2), (_hf_bert, False, 1), (_hf_gpt2, False, 2)],
    ids=["bert-checkpointing-accum2", "bert", "gpt2-gelu_new-accum2"],
)
def test_hf_models_span_by_span(
    monkeypatch, sock_path: str, make: Callable[[bool], Any], checkpointing: bool, accum: int
) -> None:
    """Each span's predicted peak (the curve's) within 10% of the live-tensor truth."""
    torch = pytest.importorskip("torch")
    from livebytes import LiveBytes

    import gpuwatch
    from gpuwatch.instrument import _api, _auto, _watch

    sent: list[dict] = []
    monkeypatch.setattr(_api, "set_facts", sent.append)
    gpuwatch.configure(socket=sock_path, enabled=True)  # nobody reads it
    torch.manual_seed(0)
    model = make(checkpointing)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    try:
        gpuwatch.watch(model, opt)
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, 1024, (2, 64), generator=g)
        live = LiveBytes()
        for t in (*model.parameters(), *model.buffers()):
            live.track(t)
        plan: list[tuple[str, int]] = []
        truth: list[int] = []

        def phase(name: str, step: int, fn: Callable[[], Any]) -> Any:
            live.peak = live.total
            out = fn()
            plan.append((name, step))
            truth.append(live.peak)
            return out

        with live:
            phase("zero_grad", 0, lambda: opt.zero_grad(set_to_none=True))
            for step in range(2):
                for _ in range(accum):
                    loss = phase("forward", step, lambda: model(input_ids=idx, labels=idx).loss)
                    phase("backward", step, (loss / accum).backward)
                    del loss
                phase("optimizer.step", step, opt.step)
                phase("zero_grad", step + 1, lambda: opt.zero_grad(set_to_none=True))
    finally:
        _auto.uninstall()
        _watch._primary = None
        _watch._reset_activations()
        _api._state.client.queue.clear()  # its phases are not the next test's
        _api._state.stack().clear()
        _api._state.set_step(0)
    p = pr.predict(sent[-1])
    # Measured: the figure is what autograd saved, whatever the shape's formula says.
    assert p.activations_source == "measured" and p.activations_formula
    peaks = pr.span_peaks(p, _spans(plan))
    assert [x.span.name for x in peaks] == [name for name, _ in plan]
    for x, real in zip(peaks, truth, strict=True):
        got = pr.total(x.peak)
        assert abs(got - real) <= 0.10 * real, (x.span, got, real)


# --------------------------------------------------------------------------- dashboard


async def test_the_peaks_tab_explains_the_selected_row() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: synthetic.end_time())
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one(PeaksTable)
        row = next(
            i for i in range(table.row_count) if str(table.get_row_at(i)[1]) == "optimizer.step"
        )
        table.move_cursor(row=row)
        await pilot.pause()
        text = str(table.detail.render())
        assert text.startswith("optimizer.step, step 5 (pid 4242): peak 50.00 GiB = weights")
        assert "AdamW foreach temporary" in text and "(rules)" in text and "(facts)" in text
        assert "unexplained" in text and "allocator cache" in text
        # Its lines are lines on the screen, never a literal backslash-n (issue 25).
        assert "\\n" not in text
        assert any(line.startswith("beyond allocated: ") for line in text.splitlines()[1:])
        unexplained = str(table.get_row_at(row)[9])
        assert unexplained != "n/a"


def test_samples_explained_rows_are_the_same_in_json_and_text(tmp_path: Path) -> None:
    out = run_cli("info", str(SPIKE))
    data = json.loads(run_cli("info", "--json", str(SPIKE)).stdout)
    for entry in data["processes"][0]["predicted"].values():
        assert entry["explained"] in out.stdout
