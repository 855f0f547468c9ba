"""collect_facts and batch_facts on real torch models and optimizers (CPU)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from _models import GPT, Llama, lora  # noqa: E402

from gpuwatch.instrument._facts import batch_facts, collect_facts  # noqa: E402
from gpuwatch.protocol import MAX_DATAGRAM, encode  # noqa: E402


def _numel(ps) -> int:
    return sum(p.numel() for p in ps)


def test_gpt_facts_from_the_module_tree() -> None:
    model = GPT(512, 64, 3, 64, 4, "eager", dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    f = collect_facts(model, opt)
    assert f["version"] == 1 and "errors" not in f
    assert f["params"]["count"] == _numel(model.parameters())
    assert f["params"]["bytes"] == 4 * f["params"]["count"]
    assert f["params"]["trainable_count"] == f["params"]["count"]
    tf = f["transformer"]
    assert tf["source"] == "modules"
    assert (tf["layers"], tf["hidden"], tf["heads"], tf["vocab"]) == (3, 64, 4, 512)
    assert tf["attention"] == "eager" and tf["norm"] == "layernorm" and tf["mlp"] == "gelu"
    assert tf["fused_qkv"] and tf["tied_embeddings"] and tf["learned_positions"]
    assert tf["intermediate"] == 256
    assert tf["dropout"]["attn"] == pytest.approx(0.1)
    o = f["optimizer"]
    assert o["class"] == "AdamW" and o["options"]["weight_decay"] == pytest.approx(0.05)
    # torch picks the for-loop on the CPU (foreach kernels are for CUDA-like devices).
    assert o["impl"] == "for-loop" and not o["impl_explicit"]
    assert o["state_bytes"] == 0
    assert sum(b["count"] for b in o["groups"]) == f["params"]["count"]


def test_llama_facts_from_its_config_and_lora() -> None:
    model = lora(Llama(512, 2, 64, 4, 2, 176, "sdpa"), 4)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    f = collect_facts(model, opt, amp_dtype=torch.bfloat16, checkpointing=True)
    tf = f["transformer"]
    assert tf["source"] == "config" and tf["model_type"] == "llama"
    assert (tf["kv_heads"], tf["intermediate"], tf["attention"]) == (2, 176, "sdpa")
    assert tf["norm"] == "rmsnorm" and tf["norm_upcast"] and tf["mlp"] == "gated"
    assert tf["rope"] and not tf["tied_embeddings"] and not tf["learned_positions"]
    assert tf["lora"] == {"rank": 4, "targets": ["q", "v"]}
    assert not any(tf["trainable"].values())
    adapters = _numel(p for p in model.parameters() if p.requires_grad)
    assert f["params"]["trainable_count"] == adapters
    assert f["params"]["frozen_count"] == f["params"]["count"] - adapters
    assert f["optimizer"]["impl"] == "fused" and f["optimizer"]["impl_explicit"]
    assert f["amp"] == {"dtype": "bfloat16", "source": "argument"}
    assert f["checkpointing"] == {"enabled": True, "source": "argument"}


def test_checkpointing_read_from_the_model_and_state_after_a_step() -> None:
    model = Llama(512, 2, 64, 4, 2, 176)
    model.gradient_checkpointing_enable()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    idx = torch.randint(0, 512, (2, 16))
    model(idx, idx).backward()
    opt.step()
    f = collect_facts(model, opt)
    assert f["checkpointing"] == {"enabled": True, "source": "hf"}
    assert f["optimizer"]["state_bytes"] == 4 * f["params"]["count"]  # momentum buffers
    assert f["optimizer"]["impl"] == "foreach"


def test_checkpointing_read_under_transformers_5_names_without_a_warning() -> None:
    """Transformers 5 warns (FutureWarning) on ``is_gradient_checkpointing``: the facts
    read ``is_activation_checkpointing`` where it exists, so the run prints nothing."""

    class Renamed(Llama):
        @property
        def is_gradient_checkpointing(self) -> bool:
            warnings.warn("use is_activation_checkpointing", FutureWarning, stacklevel=2)
            return self.gradient_checkpointing

        @property
        def is_activation_checkpointing(self) -> bool:
            return self.gradient_checkpointing

    model = Renamed(512, 2, 64, 4, 2, 176)
    model.gradient_checkpointing_enable()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = collect_facts(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert f["checkpointing"] == {"enabled": True, "source": "hf"}


def test_facts_are_json_and_fit_in_a_datagram() -> None:
    model = GPT(512, 64, 2, 64, 4)
    groups = [{"params": [p], "weight_decay": 0.0} for p in model.parameters()]
    f = collect_facts(model, torch.optim.AdamW(groups))
    data = encode("facts", 1, 0, 0, 0, {"facts": f})
    assert len(data) < MAX_DATAGRAM
    assert json.loads(data)["facts"]["params"]["count"] == f["params"]["count"]


def test_collect_facts_never_raises() -> None:
    class Odd(torch.nn.Module):
        @property
        def config(self):
            raise RuntimeError("boom")

    for model in (object(), None, Odd(), torch.nn.Linear(3, 3)):
        f = collect_facts(model, object())
        assert f["version"] == 1
        json.dumps(f)
    bad = collect_facts(object())
    assert bad["errors"]  # what failed is said, not raised


def test_batch_facts() -> None:
    ids = torch.zeros(3, 17, dtype=torch.long)
    assert batch_facts((ids,), {}) | {} == {
        "shape": [3, 17],
        "dtype": "int64",
        "device": "cpu",
        "batch": 3,
        "seq": 17,
        "autocast": None,
    }
    assert batch_facts((), {"input_ids": ids})["seq"] == 17
    assert batch_facts(({"input_ids": ids},), {})["batch"] == 3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert batch_facts((ids,), {})["autocast"] == "bfloat16"
    assert batch_facts((1, "x"), None) == {}
    assert batch_facts(None, None) == {}


def test_only_a_sequence_has_a_sequence_length() -> None:
    images = batch_facts((torch.zeros(8, 3, 64, 64),), {})
    assert images["batch"] == 8 and "seq" not in images  # not seq=3 (the channels)
    assert "seq" not in batch_facts((torch.zeros(8, 20),), {})  # a table of features
    embeds = batch_facts((), {"inputs_embeds": torch.zeros(2, 9, 16)})
    assert (embeds["batch"], embeds["seq"]) == (2, 9)


def test_facts_drive_the_predictor_for_a_real_model() -> None:
    from gpuwatch.predict import predict

    model = GPT(512, 64, 2, 64, 4, "sdpa")
    opt = torch.optim.AdamW(model.parameters())
    f = collect_facts(model, opt)
    f["batch"] = batch_facts((torch.zeros(2, 64, dtype=torch.long),), {})
    p = predict(f)
    assert p.activations_known and not math.isnan(p.peak_bytes)
    assert p.phases["forward", True].start["weights"] == f["params"]["bytes"]
