"""Facts for a model that does not exist yet: from a shape or a Hugging Face config.

``gpuwatch estimate`` builds the same facts dict a training script would send
(``docs/facts.md``) and runs the same predictor on it. Parameter tensors are listed per
architecture the way GPT-2 (``modeling_gpt2.py``) and LLaMA (``modeling_llama.py``) make
them, so counts, the largest tensors and Adafactor's factored sizes are exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed")
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adamw-8bit")
IMPLS = ("foreach", "fused", "for-loop")

# precision -> (weight dtype, autocast dtype)
_PRECISION = {
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "fp16": ("float16", None),
    "bf16-mixed": ("float32", "bfloat16"),
    "fp16-mixed": ("float32", "float16"),
}
_ELT = {"float32": 4, "bfloat16": 2, "float16": 2}
_OPTIMIZER_CLASS = {
    "adamw": ("AdamW", "torch.optim.adamw", {}),
    "adam": ("Adam", "torch.optim.adam", {}),
    "sgd": ("SGD", "torch.optim.sgd", {"momentum": 0.0}),
    "sgd-momentum": ("SGD", "torch.optim.sgd", {"momentum": 0.9}),
    "adafactor": ("Adafactor", "torch.optim._adafactor", {}),
    "adamw-8bit": ("AdamW8bit", "bitsandbytes.optim.adamw", {}),
}
SMALL_TENSOR = 4096  # bitsandbytes' min_8bit_size


@dataclass
class ModelShape:
    """A decoder-only transformer's shape.

    Attributes:
        arch: ``"gpt"`` (GPT-2: LayerNorm, fused QKV, GeLU MLP, learned positions, biases)
            or ``"llama"`` (RMSNorm, q/k/v projections, SwiGLU, rotary, no biases).
        tied: LM head shares the token embedding (GPT-2 default; LLaMA unties).
        max_positions: Learned position table size (GPT only; default ``seq``).
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    arch: str = "gpt"
    kv_heads: int | None = None
    intermediate: int | None = None
    tied: bool | None = None
    max_positions: int | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        self.kv_heads = self.kv_heads or self.heads
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv heads {self.kv_heads}")
        if not self.intermediate:
            self.intermediate = 4 * self.hidden if self.arch == "gpt" else 8 * self.hidden // 3
        if self.tied is None:
            self.tied = self.arch == "gpt"

    def tensors(self, seq: int) -> list[tuple[int, ...]]:
        """Every parameter tensor's shape."""
        h, f, v = self.hidden, self.intermediate or 0, self.vocab
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        out: list[tuple[int, ...]] = [(v, h)]
        if self.arch == "gpt":
            out.append((self.max_positions or seq, h))
            layer = [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,)]
            layer += [(f, h), (f,), (h, f), (h,)]
            final = [(h,), (h,)]
        else:
            layer = [(h,), (h, h), (kv, h), (kv, h), (h, h), (h,), (f, h), (f, h), (h, f)]
            final = [(h,)]
        out += layer * self.layers + final
        if not self.tied:
            out.append((v, h))
        return out

    def lora_tensors(self, rank: int) -> list[tuple[int, ...]]:
        """LoRA A and B for q and v in every layer (PEFT's LLaMA defaults)."""
        h = self.hidden
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        q_out = 3 * h if self.arch == "gpt" else h
        per = [(rank, h), (q_out, rank)] + ([] if self.arch == "gpt" else [(rank, h), (kv, rank)])
        return per * self.layers


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _bucket(shapes: list[tuple[int, ...]], elt: int, dtype: str) -> dict[str, Any]:
    sizes = [*sorted((_numel(s) * elt for s in shapes), reverse=True), 0, 0]
    factored = vector = small = 0
    for s in shapes:
        n = _numel(s)
        if len(s) >= 2:
            factored += n // s[-1] + n // s[-2]
        else:
            vector += n
        if n < SMALL_TENSOR:
            small += n
    count = sum(_numel(s) for s in shapes)
    return {
        "group": 0,
        "device": "cuda:0",
        "dtype": dtype,
        "tensors": len(shapes),
        "count": count,
        "bytes": count * elt,
        "max_tensor_bytes": sizes[0],
        "second_tensor_bytes": sizes[1],
        "small_count": small,
        "factored_count": factored,
        "vector_count": vector,
    }


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` dict."""
    from ..instrument._facts import _CONFIG_NAMES  # the same names the script reads

    def pick(key: str) -> int | None:
        for name in _CONFIG_NAMES[key]:
            v = config.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    missing = [k for k in ("layers", "hidden", "heads", "vocab") if pick(k) is None]
    if missing:
        raise ValueError(f"config has no {', '.join(missing)}")
    model_type = str(config.get("model_type", ""))
    act = str(config.get("hidden_act") or config.get("activation_function") or "")
    gpt_like = model_type in ("gpt2", "gpt_neo", "gptj", "gpt_bigcode", "opt") or (
        "gelu" in act and "intermediate_size" not in config
    )
    return ModelShape(
        layers=pick("layers") or 0,
        hidden=pick("hidden") or 0,
        heads=pick("heads") or 0,
        vocab=pick("vocab") or 0,
        arch="gpt" if gpt_like else "llama",
        kv_heads=pick("kv_heads"),
        intermediate=pick("intermediate"),
        tied=config.get("tie_word_embeddings", True if gpt_like else None),
        max_positions=pick("max_positions"),
    )


def facts_from_shape(
    shape: ModelShape | None,
    *,
    params: int | None = None,
    batch: int | None = None,
    seq: int | None = None,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    impl: str = "foreach",
    attention: str = "sdpa",
    checkpointing: bool = False,
    lora_rank: int = 0,
) -> dict[str, Any]:
    """The facts a training script with this model and settings would send.

    Args:
        shape: The model's shape, or None when only ``params`` is known (then activations
            stay unknown).
        params: Parameter count, when there is no shape.
        batch, seq: The batch shape (both needed for activations).
        precision, optimizer, impl, attention: As ``gpuwatch estimate`` takes them.
        checkpointing: Activation checkpointing of every layer.
        lora_rank: Freeze the model and train LoRA adapters of this rank on q and v.
    """
    if precision not in _PRECISION:
        raise ValueError(f"unknown precision {precision!r}")
    if optimizer not in _OPTIMIZER_CLASS:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    dtype, amp = _PRECISION[precision]
    elt = _ELT[dtype]
    seq_for_positions = seq or (shape.max_positions if shape else None) or 1024
    if shape is not None:
        base = shape.tensors(seq_for_positions)
    elif params and params > 0:
        base = [(int(params),)]
    else:
        raise ValueError("give --params, a shape (--layers --hidden --heads --vocab) or --config")
    adapters = shape.lora_tensors(lora_rank) if (shape and lora_rank) else []
    trainable = adapters if lora_rank else base
    base_count = sum(_numel(s) for s in base)
    adapter_count = sum(_numel(s) for s in adapters)
    count = base_count + adapter_count
    t_count = sum(_numel(s) for s in trainable)
    groups = [
        {
            "dtype": dtype,
            "device": "cuda:0",
            "trainable": not lora_rank,
            "count": base_count,
            "bytes": base_count * elt,
            "tensors": len(base),
        }
    ]
    if adapters:
        groups.append(
            {
                "dtype": dtype,
                "device": "cuda:0",
                "trainable": True,
                "count": adapter_count,
                "bytes": adapter_count * elt,
                "tensors": len(adapters),
            }
        )
    cls, module, extra = _OPTIMIZER_CLASS[optimizer]
    facts: dict[str, Any] = {
        "version": 1,
        "params": {
            "count": count,
            "bytes": count * elt,
            "trainable_count": t_count,
            "trainable_bytes": t_count * elt,
            "frozen_count": count - t_count,
            "frozen_bytes": (count - t_count) * elt,
            "groups": groups,
        },
        "buffers": {"count": 0, "bytes": 0, "groups": []},
        "optimizer": {
            "class": cls,
            "module": module,
            "impl": impl,
            "impl_explicit": True,
            "options": {
                "weight_decay": 0.01,
                "foreach": impl == "foreach",
                "fused": impl == "fused",
                **extra,
            },
            "groups": [_bucket(trainable, elt, dtype)],
            "state_bytes": 0,
            "state_tensors": 0,
        },
        "amp": {"dtype": amp, "source": "argument" if amp else None},
        "checkpointing": {"enabled": checkpointing, "source": "argument"},
    }
    if shape is not None:
        roles = ("q", "k", "v", "o", "gate", "up", "down", "norm", "embed", "head")
        gpt = shape.arch == "gpt"
        facts["transformer"] = {
            "source": "estimate",
            "layers": shape.layers,
            "hidden": shape.hidden,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "intermediate": shape.intermediate,
            "vocab": shape.vocab,
            "attention": attention,
            "norm": "layernorm" if gpt else "rmsnorm",
            "norm_upcast": not gpt,
            "mlp": "gelu" if gpt else "gated",
            "fused_qkv": gpt,
            "rope": not gpt,
            "softmax_fp32": not gpt,
            "learned_positions": gpt,
            "tied_embeddings": bool(shape.tied),
            "bias": gpt,
            "trainable": {r: not lora_rank for r in roles},
            **({"lora": {"rank": lora_rank, "targets": ["q", "v"]}} if lora_rank else {}),
        }
    if batch and seq:
        facts["batch"] = {"shape": [batch, seq], "batch": batch, "seq": seq, "autocast": amp}
    return facts
