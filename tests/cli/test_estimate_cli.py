"""``gpuwatch estimate`` as a user runs it: its output and exit status.

Most cases run the command's ``main()`` in this process (``run_cli``: a child spends
seconds importing torch and transformers again); bad input and the trace's quiet stderr
are checked on a real child as well.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli, run_gpuwatch


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_cli("estimate", *args, cwd=cwd)


def test_json_from_shape_options() -> None:
    r = _run(
        "--layers",
        "48",
        "--hidden",
        "1600",
        "--heads",
        "25",
        "--vocab",
        "50257",
        "--seq",
        "1024",
        "--batch",
        "2",
        "--precision",
        "fp16-mixed",
        "--optimizer",
        "adam",
        "--optimizer-impl",
        "fused",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["phases"]) == {"forward", "backward", "optimizer.step", "zero_grad", "eval"}
    step = out["phases"]["optimizer.step"]
    states = step["weights"] + step["gradients"] + step["optimizer_state"]
    assert states == pytest.approx(16 * out["parameters"], rel=1e-4)
    assert out["phases"]["forward"]["activations"] > 0
    assert out["peak_bytes"] == max(sum(p.values()) for p in out["phases"].values())


def test_checkpoint_every_k_th_layer() -> None:
    shape = ("--layers", "8", "--hidden", "512", "--heads", "8", "--vocab", "1000")
    act = {}
    for flags in ((), ("--checkpointing",), ("--checkpoint-every", "2")):
        r = _run(*shape, "--seq", "256", "--batch", "4", *flags, "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        act[flags[-1] if flags else "none"] = out["phases"]["forward"]["activations"]
    assert act["--checkpointing"] < act["2"] < act["none"]
    assert any("every 2nd layer checkpointed" in a for a in out["assumed"])
    bad = _run(*shape, "--checkpoint-every", "0")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_table_from_a_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "intermediate_size": 688,
                "vocab_size": 32000,
                "max_position_embeddings": 512,
                "hidden_act": "silu",
                "tie_word_embeddings": False,
            }
        )
    )
    r = _run("--config", str(cfg), "--lora-rank", "8", "--checkpointing", "--attention", "eager")
    assert r.returncode == 0, r.stderr
    assert "optimizer.step" in r.stdout and "activations" in r.stdout and "peak:" in r.stdout


def test_params_only_says_activations_are_unknown() -> None:
    r = _run("--params", "7e9", "--precision", "bf16", "--optimizer", "adamw-8bit", "--json")
    out = json.loads(r.stdout)
    assert not out["activations_known"] and out["phases"]["forward"]["activations"] == 0
    assert out["phases"]["forward"]["weights"] == 14_000_000_000


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--layers", "2"),
        ("--layers", "2", "--hidden", "100", "--heads", "3", "--vocab", "10"),
        ("--config", "/no/such/config.json"),
        ("--params", "1e6", "--lora-rank", "4"),
        ("--trace", "nocolon"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    r = run_gpuwatch("estimate", *args)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("gpuwatch: ")


def test_trace_plans_the_sample_per_phase_on_fake_tensors() -> None:
    pytest.importorskip("torch")
    r = _run("--trace", "samples/trace_tiny_gpt.py:build", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    later, first = out["phases"], out["first_step"]
    assert later["optimizer.step"]["weights"] > 0 and later["forward"]["optimizer_state"] > 0
    assert not first["forward"].get("optimizer_state") and later["forward"]["activations"] > 0
    assert out["peak_bytes"] == max(sum(b.values()) for d in (later, first) for b in d.values())


def test_trace_keeps_memtrackers_chatter_out_of_the_terminal(tmp_path: Path) -> None:
    """A module built inside forward is gone before its backward: MemTracker warns about
    its own bookkeeping, which is not the user's business."""
    pytest.importorskip("torch")
    script = tmp_path / "temp_module.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = nn.Linear(32, 32)\n"
        "    def forward(self, x):\n"
        "        return nn.ReLU()(self.lin(x)).sum()\n"
        "def build():\n"
        "    model = Net()\n"
        "    return model, torch.optim.AdamW(model.parameters()), (torch.randn(8, 32),)\n"
    )
    r = run_gpuwatch("estimate", "--trace", f"{script}:build")  # C++ and warnings too
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_given_sequence_length_is_not_also_assumed(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512}
        )
    )
    r = _run("--config", str(config), "--seq", "32")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stdout.splitlines() if "sequence length" in line]
    assert said == ["assumed: sequence length 32 (--seq)"], r.stdout


# --------------------------------------------------------------------------- families


def _hf_configs() -> dict[str, tuple[Any, Any]]:
    """(config, model class) of each family estimate supports, small and at full size."""
    t = pytest.importorskip("transformers")
    return {
        "bert-large": (
            t.BertConfig(
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                intermediate_size=4096,
                architectures=["BertForMaskedLM"],
            ),
            t.BertForMaskedLM,
        ),
        "bert-base-model": (t.BertConfig(architectures=["BertModel"]), t.BertModel),
        "roberta-base": (
            t.RobertaConfig(
                vocab_size=50265,
                max_position_embeddings=514,
                type_vocab_size=1,
                architectures=["RobertaForMaskedLM"],
            ),
            t.RobertaForMaskedLM,
        ),
        "pythia-1b": (
            t.GPTNeoXConfig(
                vocab_size=50304,
                hidden_size=2048,
                num_hidden_layers=16,
                num_attention_heads=8,
                intermediate_size=8192,
                rotary_pct=0.25,
                max_position_embeddings=2048,
                tie_word_embeddings=False,
                architectures=["GPTNeoXForCausalLM"],
            ),
            t.GPTNeoXForCausalLM,
        ),
        "vit-base": (
            t.ViTConfig(num_labels=1000, architectures=["ViTForImageClassification"]),
            t.ViTForImageClassification,
        ),
        "gpt2": (t.GPT2Config(architectures=["GPT2LMHeadModel"]), t.GPT2LMHeadModel),
        "falcon-7b": (
            t.FalconConfig(**json.loads((ROOT / "samples/configs/falcon-7b.json").read_text())),
            t.FalconForCausalLM,
        ),
        "falcon-40b": (
            t.FalconConfig(**json.loads((ROOT / "samples/configs/falcon-40b.json").read_text())),
            t.FalconForCausalLM,
        ),
        "qwen2": (
            t.Qwen2Config(
                hidden_size=256,
                intermediate_size=688,
                num_hidden_layers=2,
                num_attention_heads=8,
                num_key_value_heads=2,
                vocab_size=1000,
                tie_word_embeddings=False,
                architectures=["Qwen2ForCausalLM"],
            ),
            t.Qwen2ForCausalLM,
        ),
        "llama": (
            t.LlamaConfig(
                hidden_size=512,
                intermediate_size=1376,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=2,
                architectures=["LlamaForCausalLM"],
            ),
            t.LlamaForCausalLM,
        ),
    }


def _real_count(cls: Any, cfg: Any) -> int:
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = cls(cfg)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors once


@pytest.mark.parametrize(
    "family",
    [
        "bert-large",
        "bert-base-model",
        "roberta-base",
        "pythia-1b",
        "vit-base",
        "gpt2",
        "llama",
        "falcon-7b",
        "falcon-40b",
        "qwen2",
    ],
)
def test_each_family_counts_its_parameters_exactly(tmp_path: Path, family: str) -> None:
    cfg, cls = _hf_configs()[family]
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json_string())
    r = _run("--config", str(path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["parameters"] == _real_count(cls, cfg)
    assert out["activations_known"] and out["phases"]["forward"]["activations"] > 0
    assert any(a.startswith("head: ") for a in out["assumed"])
    assert any("batch 1" in a for a in out["assumed"])
    if family == "vit-base":
        assert out["seq"] == 197 and out["layout"] == "vit"
    else:
        assert any("sequence length" in a for a in out["assumed"])


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"model_type": "nosuchfamily", "num_layers": 6, "d_model": 512}, "'nosuchfamily'"),
        ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}, "no model_type"),
    ],
)
def test_unknown_families_and_heads_are_refused(
    tmp_path: Path, config: dict[str, Any], why: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = _run("--config", str(path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpuwatch: ") and r.stderr.strip().count("\n") == 0
    assert why in r.stderr


META_FAMILIES = {
    "t5": {
        "model_type": "t5",
        "num_layers": 2,
        "d_model": 128,
        "num_heads": 4,
        "d_ff": 256,
        "d_kv": 32,
        "vocab_size": 1000,
        "architectures": ["T5ForConditionalGeneration"],
    },
    "mixtral": {
        "model_type": "mixtral",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 1000,
        "architectures": ["MixtralForCausalLM"],
    },
    "gemma": {
        "model_type": "gemma",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 1000,
        "architectures": ["GemmaForCausalLM"],
    },
    "phi": {
        "model_type": "phi",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "architectures": ["PhiForCausalLM"],
    },
    "bert-qa": {
        "model_type": "bert",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "architectures": ["BertForQuestionAnswering"],
    },
}


@pytest.mark.parametrize("family", sorted(META_FAMILIES))
def test_families_without_a_closed_form_are_counted_on_the_meta_device(
    tmp_path: Path, family: str
) -> None:
    t = pytest.importorskip("transformers")
    config = META_FAMILIES[family]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = json.loads(_run("--config", str(path), "--json").stdout)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    cfg = t.AutoConfig.for_model(config["model_type"], **fields)
    cls = getattr(t, config["architectures"][0])
    assert out["parameters"] == _real_count(cls, cfg)
    assert any("meta device" in a for a in out["assumed"])
    # No length in the config and none given: the activations stay unknown, said so.
    assert not out["activations_known"]
    assert any("give --seq" in a for a in out["assumed"])
    # With one, a training step on fake tensors gives them (issue 42, item 1), where the
    # model trains on labels; a question-answering head does not, and says why.
    out = json.loads(_run("--config", str(path), "--seq", "64", "--json").stdout)
    traced = any(a.startswith("activations traced") for a in out["assumed"])
    assert out["activations_known"] == traced == (family != "bert-qa"), out["assumed"]
    if not traced:
        assert any("fake-tensor step failed" in a for a in out["assumed"])
    else:
        assert out["phases"]["forward"]["activations"] > 0


def test_a_vision_family_without_a_closed_form_is_traced_on_images(tmp_path: Path) -> None:
    # DeiT (a ViT with a distillation token): no length in the config, none needed, the
    # image decides it; the trace feeds it images (token ids failed it before).
    pytest.importorskip("transformers")
    config = {
        "model_type": "deit",
        "architectures": ["DeiTForImageClassification"],
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 8,
        "num_labels": 10,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = json.loads(_run("--config", str(path), "--json").stdout)
    assert out["activations_known"] and out["seq"] == 18, out["assumed"]  # 16 + CLS + dist
    assert any("3×32×32 image (the config's)" in a for a in out["assumed"])
    assert any(a.startswith("activations traced") for a in out["assumed"])
    assert out["phases"]["forward"]["activations"] > 0
    r = _run("--config", str(path), "--seq", "64")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--seq 64: this model sees 18 tokens per image" in r.stderr


LLAMA_7B = ("--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "32000")


def test_params_conflicting_with_the_shape_is_refused() -> None:
    # 24 layers where LLaMA-7B has 32: a different model, said, not silently replaced.
    shape = ("--layers", "24", *LLAMA_7B[2:], "--arch", "llama", "--seq", "2048")
    r = _run("--params", "6738415616", *shape)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--params 6,738,415,616 but the shape has 5,0" in r.stderr


def test_params_agreeing_with_the_shape_is_honoured() -> None:
    shape = (*LLAMA_7B, "--arch", "llama", "--intermediate", "11008", "--seq", "2048")
    r = _run("--params", "6738415616", *shape, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["parameters"] == 6738415616  # LLaMA-7B, tensor by tensor
    assert any("--params 6,738,415,616 agrees" in a for a in out["assumed"])


def test_params_alone_is_honoured() -> None:
    r = _run("--params", "6738415616", "--precision", "fp32", "--json")
    out = json.loads(r.stdout)
    assert out["parameters"] == 6738415616
    assert out["phases"]["optimizer.step"]["weights"] == 4 * 6738415616


def test_dropout_keeps_masks_and_is_said() -> None:
    base = ("--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--seq", "512")
    outs = [
        json.loads(_run(*base, *extra, "--json").stdout) for extra in ((), ("--dropout", "0.1"))
    ]
    without, with_ = (o["phases"]["forward"]["activations"] for o in outs)
    assert with_ > without
    assert "no dropout (--dropout)" in outs[0]["assumed"]
    assert "dropout 0.1 everywhere (--dropout)" in outs[1]["assumed"]
    r = _run(*base, "--dropout", "1.5")  # argparse's own one-line refusal
    assert r.returncode == 2 and "--dropout: must be in [0, 1)" in r.stderr


def test_the_table_prints_what_was_assumed(tmp_path: Path) -> None:
    cfg, _ = _hf_configs()["bert-base-model"]
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json_string())
    r = _run("--config", str(path))
    assert r.returncode == 0, r.stderr
    assumed = [ln for ln in r.stdout.splitlines() if ln.startswith("assumed: ")]
    assert "assumed: head: pooler (BertModel)" in assumed
    assert "assumed: sequence length 512 (the config's positions; --seq to change)" in assumed


def test_a_vit_shape_needs_no_vocabulary() -> None:
    r = _run("--arch", "vit", "--layers", "2", "--hidden", "128", "--heads", "4", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["seq"] == 197 and out["activations_known"]


@pytest.mark.parametrize("family", ["bert", "neox", "vit"])
def test_estimated_peaks_hold_against_real_training_on_the_cpu(family: str) -> None:
    """The estimate of a small model of each family (device set to the CPU, where the
    truth is measured) within 10% of the live-tensor peaks of HF's own model."""
    torch = pytest.importorskip("torch")
    t = pytest.importorskip("transformers")
    from livebytes import LiveBytes

    from gpuwatch.predict import breakdown, predict, total
    from gpuwatch.predict._shape import facts_from_shape, shape_from_config

    small = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "intermediate_size": 512,
    }
    torch.manual_seed(0)
    if family == "bert":
        cfg = t.BertConfig(**small, vocab_size=1024, max_position_embeddings=64)
        cfg.architectures = ["BertForMaskedLM"]
        model = t.BertForMaskedLM(cfg)
        ids = torch.randint(0, 1024, (4, 64))
        inputs = {"input_ids": ids, "labels": ids}
    elif family == "neox":
        cfg = t.GPTNeoXConfig(**small, vocab_size=1024, max_position_embeddings=64)
        cfg.architectures = ["GPTNeoXForCausalLM"]
        model = t.GPTNeoXForCausalLM(cfg)
        ids = torch.randint(0, 1024, (4, 64))
        inputs = {"input_ids": ids, "labels": ids}
    else:
        cfg = t.ViTConfig(**small, image_size=64, patch_size=8, num_labels=1000)
        cfg.architectures = ["ViTForImageClassification"]
        model = t.ViTForImageClassification(cfg)
        inputs = {"pixel_values": torch.randn(4, 3, 64, 64), "labels": torch.randint(0, 9, (4,))}
    model.train()
    got = shape_from_config(cfg.to_dict())
    facts = facts_from_shape(got.shape, batch=4, seq=got.seq, precision="fp32", dropout=got.dropout)
    facts = json.loads(json.dumps(facts).replace('"cuda:0"', '"cpu"'))  # measured on the CPU
    p = predict(facts)
    assert facts["params"]["count"] == sum(x.numel() for x in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    live = LiveBytes()
    for x in (*model.parameters(), *model.buffers()):
        live.track(x)
    with live:
        for step in range(2):
            for name, fn in (
                ("forward", lambda: model(**inputs).loss),
                ("backward", None),
                ("optimizer.step", opt.step),
            ):
                live.peak = live.total
                if name == "forward":
                    loss = fn()
                elif name == "backward":
                    loss.backward()
                    del loss
                else:
                    fn()
                pred = total(breakdown(p, name, first_step=step == 0))
                assert abs(pred - live.peak) <= 0.10 * live.peak, (name, step, pred, live.peak)
            opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    ("given", "count"),
    [("7B", 7 * 10**9), ("1.3b", 1_300_000_000), ("350M", 350 * 10**6), ("2T", 2 * 10**12),
     ("124k", 124_000), ("7e9", 7 * 10**9)],
)  # fmt: skip
def test_params_take_the_suffixes_model_cards_use(given: str, count: int) -> None:
    r = _run("--params", given, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parameters"] == count


@pytest.mark.parametrize(
    "args", [("--params", "7X"), ("--params", "B"), ("--params", "inf"), ("--layers", "inf")]
)
def test_bad_counts_are_one_line(args: tuple[str, ...]) -> None:
    r = _run(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not a" in r.stderr
