"""The predictor on its own: published figures, optimizer rules, the curve, odd facts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.predict import (
    CATEGORIES,
    Span,
    breakdown,
    breakdown_at,
    predict,
    predicted_curve,
    total,
)
from gpuwatch.predict._graph import simulate
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.predict._transformer import Arch, record

B, S, H, A = 4, 512, 1024, 16


def _layer_bytes(**kw) -> int:
    """Saved bytes of one layer: two layers minus one (head and embeddings cancel)."""
    saved = []
    for layers in (1, 2):
        ops, loss = record(Arch(layers=layers, hidden=H, heads=A, vocab=1000, batch=B, seq=S, **kw))
        end = simulate(ops, [loss]).forward_end
        saved.append(end.saved)
    return saved[1] - saved[0]


GPT16 = dict(param_elt=2, device="cuda", attn_dropout=0.1, resid_dropout=0.1)


def test_korthikanti_per_layer_formula_at_16_bits() -> None:
    # Korthikanti et al. 2022, eq. (1): sbh(34 + 5as/h) bytes per layer, 16-bit, dropout.
    sbh = S * B * H
    stats = 2 * 2 * S * B * 4  # LayerNorm mean and rstd (fp32), not in the paper's count
    assert _layer_bytes(attention="eager", **GPT16) == sbh * (34 + 5 * A * S / H) + stats


def test_flash_attention_drops_the_s_squared_term() -> None:
    sbh = S * B * H
    lse = B * A * S * 4  # the log-sum-exp flash attention keeps
    stats = 2 * 2 * S * B * 4
    assert _layer_bytes(attention="sdpa", **GPT16) == 34 * sbh + lse + stats


def test_fp32_doubles_every_activation_but_masks() -> None:
    sbh = S * B * H
    stats = 2 * 2 * S * B * 4
    got = _layer_bytes(
        attention="eager", param_elt=4, device="cuda", attn_dropout=0.1, resid_dropout=0.1
    )
    # 16 two-byte units become four-byte ones; bool masks stay one byte (sbh and as²b).
    assert got == sbh * (32 * 2 + 2) + A * S * S * B * (4 + 4 + 1) + stats


def test_full_checkpointing_keeps_each_layers_input() -> None:
    # Korthikanti et al. 2022, section 5: about 2sbh per layer (its input at 16 bits).
    saved = []
    for layers in (2, 3):
        ops, loss = record(
            Arch(
                layers=layers,
                hidden=H,
                heads=A,
                vocab=1000,
                batch=B,
                seq=S,
                checkpointing=True,
                **GPT16,
            )
        )
        saved.append(simulate(ops, [loss]).forward_end.saved)
    assert saved[1] - saved[0] == 2 * S * B * H


def test_checkpointing_recomputes_one_layer_in_backward() -> None:
    base = dict(hidden=H, heads=A, vocab=1000, batch=B, seq=S, layers=4, **GPT16)
    plain = simulate(*_rec(Arch(**base)))
    ckpt = simulate(*_rec(Arch(checkpointing=True, **base)))
    assert ckpt.forward_end.saved < plain.forward_end.saved / 3
    # Backward holds the checkpoints plus one recomputed layer, far less than everything.
    assert ckpt.backward_peak.total() < plain.backward_peak.total()
    assert ckpt.backward_peak.saved > ckpt.forward_end.saved


def test_checkpointing_every_second_layer_keeps_half_of_each() -> None:
    # Layers 2 and 4 of 4 checkpointed (torchtitan's ac_freq 2): two layers keep their
    # input, two keep all they save; embeddings and the head are the same in all three.
    base = dict(hidden=H, heads=A, vocab=1000, batch=B, seq=S, layers=4, **GPT16)
    saved = [
        simulate(*_rec(Arch(**base, **kw))).forward_end.saved
        for kw in ({}, {"checkpointing": True}, {"checkpointing": True, "checkpoint_every": 2})
    ]
    plain, every, second = saved
    assert second == (plain + every) // 2
    assert every < second < plain


def _rec(arch: Arch):
    ops, loss = record(arch)
    return ops, [loss]


def test_gpt2_xl_mixed_precision_adam_is_16_bytes_per_parameter() -> None:
    # ZeRO (Rajbhandari et al. 2020, section 3.1): 1.5B parameters, mixed-precision Adam,
    # 2 + 2 + 12 = 16 bytes per parameter, about 24 GB before activations.
    xl = ModelShape(layers=48, hidden=1600, heads=25, vocab=50257, max_positions=1024)
    facts = facts_from_shape(xl, precision="fp16-mixed", optimizer="adam", impl="fused")
    n = facts["params"]["count"]
    assert 1.5e9 < n < 1.6e9
    p = predict(facts)
    end = p.phases["optimizer.step", False].end
    model_states = end["weights"] + end["gradients"] + end["optimizer_state"]
    assert model_states == pytest.approx(16 * n, rel=1e-4)
    assert 24e9 < model_states < 25.5e9
    assert not p.activations_known  # no batch shape given: activations are not invented


def _opt_facts(optimizer: str, impl: str = "foreach", precision: str = "fp32") -> dict:
    shape = ModelShape(layers=2, hidden=256, heads=4, vocab=1000)
    return facts_from_shape(shape, optimizer=optimizer, impl=impl, precision=precision)


def test_optimizer_rules() -> None:
    n = _opt_facts("adamw")["params"]["count"]
    pb = 4 * n
    adamw = predict(_opt_facts("adamw")).optimizer
    assert adamw.state == 2 * pb and adamw.temp == pb  # one bucket: one param-sized temp
    assert predict(_opt_facts("adamw", "fused")).optimizer.temp == 0
    loop = predict(_opt_facts("adamw", "for-loop")).optimizer
    assert 0 < loop.temp < pb / 2  # a few tensors' worth
    assert predict(_opt_facts("sgd")).optimizer.state == 0
    assert predict(_opt_facts("sgd-momentum")).optimizer.state == pb
    ada = predict(_opt_facts("adafactor")).optimizer.state
    assert 0 < ada < pb / 20  # factored second moments: rows + columns
    eight = predict(_opt_facts("adamw-8bit")).optimizer.state
    assert 2 * n < eight < 2.2 * n


def test_foreach_temporary_is_per_param_group() -> None:
    facts = _opt_facts("adamw")
    bucket = facts["optimizer"]["groups"][0]
    half = dict(bucket, bytes=bucket["bytes"] // 2, group=1)
    facts["optimizer"]["groups"] = [dict(bucket, bytes=bucket["bytes"] // 2), half]
    # Two param groups are two foreach calls: the first's temporary is gone before the next.
    assert predict(facts).optimizer.temp == bucket["bytes"] // 2


def test_first_step_creates_state_and_later_forward_holds_it() -> None:
    facts = facts_from_shape(
        ModelShape(layers=2, hidden=256, heads=4, vocab=1000),
        batch=2,
        seq=128,
        precision="bf16-mixed",
    )
    p = predict(facts)
    first, later = p.phases["optimizer.step", True], p.phases["optimizer.step", False]
    assert first.start["optimizer_state"] == 0 and first.end["optimizer_state"] > 0
    assert later.start["optimizer_state"] == first.end["optimizer_state"]
    assert total(breakdown(p, "forward", False)) > total(breakdown(p, "forward", True))
    assert p.phases["zero_grad", False].end["gradients"] == 0
    assert breakdown(p, "backward", False)["activations"] >= 0
    assert p.phases["forward", False].peak["amp_copies"] > 0  # autocast's bf16 weight copies


def _spans(steps: int) -> list[Span]:
    out, t = [], 0
    for step in range(steps):
        for name, d in (
            ("forward", 100),
            ("backward", 200),
            ("optimizer.step", 50),
            ("zero_grad", 10),
        ):
            out.append(Span(name, t, t + d, step))
            t += d + 5
    return out


def test_curve_follows_the_phases() -> None:
    facts = facts_from_shape(
        ModelShape(layers=2, hidden=256, heads=4, vocab=1000), batch=2, seq=128, precision="fp32"
    )
    p = predict(facts)
    spans = _spans(2)
    times, values = predicted_curve(p, spans)
    assert times == sorted(times) and len(times) == len(values)
    w = p.phases["forward", True].start["weights"]
    assert values[0] == w
    assert max(values) == p.peak_bytes
    # Inside the first optimizer.step the state appears; after zero_grad gradients are gone.
    step1 = spans[2]
    mid = breakdown_at(p, spans, (step1.t0 + step1.t1) // 2)
    assert mid is not None and mid["optimizer_state"] > 0 and mid["gradients"] > 0
    after = breakdown_at(p, spans, spans[3].t1 + 1)
    assert after is not None and after["gradients"] == 0
    assert after["optimizer_state"] == p.optimizer.state
    # The first forward starts lower than the second (no state yet).
    assert breakdown_at(p, spans, spans[0].t0)["optimizer_state"] == 0
    assert breakdown_at(p, spans, spans[4].t0)["optimizer_state"] == p.optimizer.state
    assert breakdown_at(p, spans, -1) is None
    # A window that starts mid-run: first_step says the state already exists.
    later = [s for s in spans if s.step == 1]
    assert breakdown_at(p, later, later[0].t0, first_step=0)["optimizer_state"] > 0


def test_replayed_facts_predict_the_same() -> None:
    facts = facts_from_shape(
        ModelShape(layers=2, hidden=256, heads=4, vocab=1000), batch=2, seq=128
    )
    again = json.loads(json.dumps(facts))
    assert predict(again).phases == predict(facts).phases


def test_without_a_transformer_activations_are_unknown() -> None:
    p = predict({"version": 1, "params": {"bytes": 1000, "trainable_bytes": 1000}})
    assert not p.activations_known
    assert any("activations unknown" in n for n in p.notes)
    assert breakdown(p, "backward", False)["gradients"] == 1000
    assert breakdown(p, "no-such-phase")["weights"] == 0


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(["params", "optimizer", "transformer", "batch", "amp", "checkpointing"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=6))
def test_odd_facts_never_raise(facts: dict) -> None:
    p = predict(facts)
    for first in (True, False):
        assert set(breakdown(p, "forward", first)) == set(CATEGORIES)


_odd = _json | st.integers(-5, 10**12) | st.floats(allow_nan=True, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(-5, 10**9),
    _json
    | st.fixed_dictionaries(
        {}, optional={k: _odd for k in ("bytes", "saved_bytes", "amp_copy_bytes", "at")}
    ),
    st.lists(
        _json
        | st.fixed_dictionaries(
            {},
            optional={k: _odd for k in ("bytes", "out_bytes", "max_tensor_bytes", "no_backward")},
        ),
        max_size=4,
    ),
)
def test_odd_measured_activations_never_raise(saved: int, peak: object, modules: list) -> None:
    """``forward_peak`` and the modules come from the training process: any JSON there
    gives a prediction, never an exception or a negative figure."""
    act = {"source": "measured", "bytes": saved, "forward_peak": peak, "modules": modules}
    p = predict({"activations": act})
    for first in (True, False):
        for name in ("forward", "backward", "eval"):
            assert all(v >= 0 for v in breakdown(p, name, first).values())
    assert 0 <= p.peak_at["forward"] <= 1


@settings(max_examples=100, deadline=None)
@given(
    st.fixed_dictionaries(
        {k: st.integers(-3, 4096) for k in ("layers", "hidden", "heads", "vocab")},
        optional={
            k: st.integers(-3, 64) | st.none() | st.text(max_size=3)
            for k in ("kv_heads", "intermediate", "head_dim")
        },
    ),
    st.integers(-1, 64),
    st.integers(-1, 512),
)
def test_odd_transformer_shapes_never_raise(tf: dict, b: int, s: int) -> None:
    tf["layers"] = min(tf["layers"], 8)
    p = predict({"transformer": tf, "batch": {"batch": b, "seq": s}, "params": {"bytes": 10}})
    assert p.peak_bytes >= 10


def test_cublas_workspaces_one_in_the_first_forward_then_two() -> None:
    """A model on CUDA: the training thread's workspace from the first forward, autograd's
    device thread's too from the first backward on, through every later phase."""
    facts = facts_from_shape(
        ModelShape(layers=2, hidden=256, heads=4, vocab=1000), batch=2, seq=128, precision="fp32"
    )
    plain = predict(facts)
    each = 32 * 2**20
    p = predict({**facts, "blas": {"workspace_bytes": each, "source": "default"}})
    for (name, first), pm in p.phases.items():
        n = each if (name, first) == ("forward", True) else 2 * each
        for moment in ("start", "peak", "end"):
            got, before = getattr(pm, moment), getattr(plain.phases[name, first], moment)
            assert got["blas_workspaces"] == n, (name, first, moment)
            assert total(got) == total(before) + n
    assert "blas_workspaces" in CATEGORIES
    for odd in ({"workspace_bytes": -5}, {"workspace_bytes": "x"}, "x", None):
        assert predict({**facts, "blas": odd}).phases == plain.phases
