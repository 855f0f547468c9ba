"""The families ``estimate`` has no closed form for, traced on fake tensors, against a run.

Each config is its family's public architecture (Mixtral-8x7B, T5 v1.1, Gemma-7B,
Phi-2: the same layer layout, activation, norms, heads and expert routing) scaled down
to run here. ``estimate`` sees only the config: it counts the parameters on the meta
device and traces one training step on fake tensors (``cli/_hf_trace.py``); the same
model then really trains two steps on the CPU, and torch.profiler's allocator events give
each phase's true peak (``profmem``). A closed-form family (a Llama config) must agree
with the trace, and the per-layer extrapolation with a trace of every layer.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from profmem import ProfiledMemory  # noqa: E402

from gpuwatch.cli._hf_trace import build, meta_count, traced_activations  # noqa: E402
from gpuwatch.predict import ModelShape, Plan, rank_estimate, shape_from_config, total  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.10
AGREE = 0.03
"""A closed form and the trace of the same config, apart by at most this (relative)."""
BATCH, SEQ, VOCAB = 2, 128, 1024

FAMILIES: dict[str, dict[str, Any]] = {
    # Mixtral-8x7B: 8 experts, 2 per token, SwiGLU experts, GQA 32/8 heads, RMSNorm.
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 128,
        "intermediate_size": 448,
        "num_hidden_layers": 5,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "hidden_act": "silu",
        "max_position_embeddings": SEQ,
        "tie_word_embeddings": False,
    },
    # T5 v1.1: gated-GELU feed-forward, no biases, relative position buckets, an encoder
    # and a decoder (here of different depths, as a config may give them).
    "t5": {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "d_model": 128,
        "d_ff": 352,
        "d_kv": 32,
        "num_heads": 4,
        "num_layers": 4,
        "num_decoder_layers": 3,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
        "is_encoder_decoder": True,
    },
    # Gemma-7B: head_dim 256 wider than hidden / heads, GeGLU, tied embeddings scaled by
    # sqrt(hidden), RMSNorm with a +1 weight.
    "gemma": {
        "architectures": ["GemmaForCausalLM"],
        "model_type": "gemma",
        "hidden_size": 128,
        "intermediate_size": 1024,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": SEQ,
    },
    # Phi-2: parallel attention and MLP off one LayerNorm, partial rotary (0.4), biases,
    # gelu_new.
    "phi": {
        "architectures": ["PhiForCausalLM"],
        "model_type": "phi",
        "hidden_size": 160,
        "intermediate_size": 640,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "partial_rotary_factor": 0.4,
        "hidden_act": "gelu_new",
        "max_position_embeddings": SEQ,
    },
}

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": SEQ,
    "tie_word_embeddings": False,
    "vocab_size": VOCAB,
}


def _config(name: str) -> dict[str, Any]:
    return {**FAMILIES[name], "vocab_size": VOCAB}


def _truth(config: dict[str, Any]) -> dict[tuple[int, str], int]:
    """Each phase's peak of two real training steps on the CPU (fp32, AdamW for-loop)."""
    mem = ProfiledMemory("cpu")
    mem.start()
    torch.manual_seed(0)
    model = build({**config, "attn_implementation": "sdpa", "use_cache": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    inputs = {"input_ids": ids, "labels": ids}
    if config.get("is_encoder_decoder"):
        inputs["decoder_input_ids"] = ids
    for step in (1, 2):
        with mem.phase(step, "forward"):
            loss = model(**inputs).loss
        with mem.phase(step, "backward"):
            loss.backward()
        with mem.phase(step, "clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with mem.phase(step, "optimizer.step"):
            opt.step()
        with mem.phase(step, "zero_grad"):
            opt.zero_grad()
        del loss
    return mem.stop(None).peaks


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_without_a_closed_form_is_planned_from_its_trace(name: str) -> None:
    config = _config(name)
    with pytest.raises(ValueError):
        shape_from_config(config)  # no closed form: the trace is what knows it
    counted = meta_count(config)
    assert counted is not None
    act, notes = traced_activations(config, batch=BATCH, seq=SEQ, precision="fp32")
    assert act["bytes"] > 0 and act["modules"]
    assert any("experts" in n for n in notes) == (name == "mixtral")
    plan = Plan(
        None,
        params=counted[0],
        batch=BATCH,
        seq=SEQ,
        precision="fp32",
        impl="for-loop",
        device="cpu",
        activations=act,
        activations_batch=BATCH,
        tensors=counted[2],
    )
    pred = rank_estimate(plan).prediction
    assert pred.activations_known and pred.activations_source == "measured"
    bad = []
    for (step, phase), truth in sorted(_truth(config).items()):
        got = total(pred.phases[phase, step == 1].peak)
        print(f"{name} step {step} {phase}: {got / truth:.3f}")
        if abs(got - truth) > TOLERANCE * truth:
            bad.append(f"step {step} {phase}: {got / truth:.3f} of the truth")
    assert not bad, f"{name}: " + "; ".join(bad)


@pytest.mark.parametrize("name", ["mixtral", "t5"])
def test_the_per_layer_extrapolation_is_a_full_trace(name: str) -> None:
    config = _config(name)
    stacks = {k: 7 for k in ("num_hidden_layers", "num_layers") if k in config}
    config.update(stacks)
    if "num_decoder_layers" in config:
        config["num_decoder_layers"] = 5
    kw = {"batch": 1, "seq": 64, "precision": "bf16-mixed"}
    quick, notes = traced_activations(config, **kw)
    whole, _ = traced_activations(config, full=True, **kw)
    assert any("per-layer difference" in n for n in notes)
    for key in ("bytes", "tensors", "amp_copy_bytes", "held_output_bytes"):
        assert quick[key] == whole[key], key
    assert quick["forward_peak"]["saved_bytes"] == whole["forward_peak"]["saved_bytes"]
    assert [m["name"] for m in quick["modules"]] == [m["name"] for m in whole["modules"]]
    assert sum(m["grad_bytes"] for m in quick["modules"]) == sum(
        m["grad_bytes"] for m in whole["modules"]
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_closed_form_family_agrees_with_its_trace(precision: str) -> None:
    got = shape_from_config(LLAMA)
    shape: ModelShape = got.shape
    plan = Plan(shape, batch=BATCH, seq=SEQ, precision=precision, device="cpu")
    formula = rank_estimate(plan).prediction.activations_formula
    act, _ = traced_activations(LLAMA, batch=BATCH, seq=SEQ, precision=precision)
    traced = act["bytes"] + act["amp_copy_bytes"]
    assert formula is not None
    print(f"llama {precision}: formula / trace {formula / traced:.4f}")
    assert abs(formula - traced) <= AGREE * traced
