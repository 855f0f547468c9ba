"""A plan passes its training settings to the facts builder as they are, each by name."""

from __future__ import annotations

from dataclasses import fields

from gpuwatch.predict import Plan, rank_estimate
from gpuwatch.predict._plan import SETTINGS
from gpuwatch.predict._shape import ModelShape, facts_from_shape

GPT = ModelShape(layers=4, hidden=256, heads=4, vocab=5000, arch="gpt")

# Every setting away from its default, so a setting dropped on the way shows in the facts.
CHANGED = dict(
    batch=3,
    seq=96,
    precision="fp16-mixed",
    optimizer="adam",
    impl="fused",
    attention="eager",
    checkpointing=True,
    checkpoint_every=2,
    lora_rank=4,
    lora_targets=("q", "k", "v"),
    dropout={"attn": 0.1, "resid": 0.1, "embd": 0.1},
    activation="gelu_new",
    tensors=((5000, 256), (256,)),  # read only without a shape: see the shapeless test
)


def test_every_setting_is_a_plan_field() -> None:
    assert set(SETTINGS) == set(CHANGED)
    assert set(SETTINGS) <= {f.name for f in fields(Plan)}


def test_a_plan_builds_the_facts_its_settings_describe() -> None:
    got = rank_estimate(Plan(GPT, **CHANGED)).facts
    assert got == facts_from_shape(GPT, **CHANGED)
    assert got != facts_from_shape(GPT, **{**CHANGED, "activation": None})


def test_a_shapeless_plan_passes_its_parameters_tensors() -> None:
    """A model counted on the meta device: its tensors size the optimizer's buckets."""
    tensors = ((4096, 1024), (1024,), (1024, 1024))
    params = sum(a * (b[0] if b else 1) for a, *b in tensors)
    got = rank_estimate(Plan(None, params=params, tensors=tensors)).facts
    assert got == facts_from_shape(None, params=params, tensors=tensors)
    assert got != facts_from_shape(None, params=params)
