"""Facts for a model that does not exist yet: from a shape or a Hugging Face config.

``gpuwatch estimate`` builds the same facts dict a training script would send
(``docs/facts.md``) and runs the same predictor on it. Parameter tensors are listed per
architecture the way GPT-2 (``modeling_gpt2.py``) and LLaMA (``modeling_llama.py``) make
them, so counts, the largest tensors and Adafactor's factored sizes are exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..facts import CONFIG_NAMES, DROPOUT_NAMES, SMALL_TENSOR, Facts
from ._optim import ESTIMATE_OPTIMIZERS, KINDS

PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed")
OPTIMIZERS = tuple(ESTIMATE_OPTIMIZERS)
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


ARCHS = ("gpt", "llama", "bert", "roberta", "neox", "falcon", "vit")
"""Layouts whose parameters are listed tensor by tensor (counts checked against
Hugging Face's models in ``tests/cli/test_estimate_cli.py``)."""

# HF model_type -> layout. Families not listed are refused: a count that looks right but
# is not (an encoder modelled as LLaMA) is worse than no estimate.
MODEL_TYPES = {
    "gpt2": "gpt",
    "llama": "llama",
    "mistral": "llama",
    "bert": "bert",
    "roberta": "roberta",
    "gpt_neox": "neox",
    "falcon": "falcon",
    "qwen2": "llama",
    "vit": "vit",
}

HEADS = ("lm", "mlm", "pooler", "classifier", "none")
"""What sits on top of the layers: an LM head (decoders), BERT's MLM head, a pooler
(``BertModel``, ``ViTModel``), an image classifier, or nothing."""


@dataclass
class ModelShape:
    """A transformer's shape, enough to list every parameter tensor.

    Attributes:
        arch: ``"gpt"`` (GPT-2: LayerNorm, fused QKV, GeLU MLP, learned positions, biases),
            ``"llama"`` (RMSNorm, q/k/v projections, SwiGLU, rotary, no biases),
            ``"bert"`` / ``"roberta"`` (post-norm encoder: word, position and token-type
            embeddings, q/k/v with biases, GeLU MLP), ``"neox"`` (GPT-NeoX / Pythia:
            fused QKV with biases, parallel attention and MLP, rotary, untied output),
            ``"falcon"`` (Falcon: fused QKV without biases, multi-query or grouped
            attention, parallel attention and MLP after one LayerNorm, or two with
            ``new_decoder_architecture``, rotary, tied output) or
            ``"vit"`` (patch embedding, CLS token, pre-norm encoder, no vocabulary).
        tied: LM head shares the token embedding (GPT-2, BERT's MLM head; not LLaMA).
        max_positions: Learned position table size (default ``seq``).
        head: One of :data:`HEADS` (default: ``lm`` for decoders, ``mlm`` for BERT and
            RoBERTa, ``classifier`` for ViT).
        type_vocab: Token-type embeddings (BERT 2, RoBERTa 1).
        image_size, patch_size, channels, labels: ViT's input and classifier.
        head_dim: Each head's width when it is not ``hidden / heads`` (GPT-3 XL: 24
            heads of 128 in a 2048-wide model).
        layer_norms: Falcon's LayerNorms per layer (1, or 2 for the new architecture).
        qkv_bias: q/k/v projections with biases (Qwen2's LLaMA layout).
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
    head: str | None = None
    type_vocab: int | None = None
    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    labels: int = 1000
    head_dim: int | None = None
    layer_norms: int = 2
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown layout {self.arch!r} (one of {', '.join(ARCHS)})")
        names = ("layers", "hidden", "heads") + (("vocab",) if self.arch != "vit" else ())
        for name in names:
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.head_dim is not None and self.head_dim <= 0:
            raise ValueError("head_dim must be positive")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(
                f"hidden {self.hidden} is not a multiple of heads {self.heads}:"
                " give the head size (--head-dim, head_dim in a config)"
            )
        self.head_dim = self.head_dim or self.hidden // self.heads
        self.kv_heads = self.kv_heads or self.heads
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv heads {self.kv_heads}")
        if not self.intermediate:
            gated = self.arch == "llama"
            self.intermediate = 8 * self.hidden // 3 if gated else 4 * self.hidden
        if self.arch == "falcon" and self.layer_norms not in (1, 2):
            raise ValueError("falcon has one or two LayerNorms a layer")
        if self.head is None:
            self.head = {"bert": "mlm", "roberta": "mlm", "vit": "classifier"}.get(self.arch, "lm")
        if self.head not in HEADS:
            raise ValueError(f"unknown head {self.head!r}")
        if self.tied is None:
            self.tied = self.arch in ("gpt", "bert", "roberta", "falcon")
        if self.type_vocab is None:
            self.type_vocab = {"bert": 2, "roberta": 1}.get(self.arch, 0)
        if self.arch == "vit" and (self.image_size <= 0 or self.patch_size <= 0):
            raise ValueError("image and patch sizes must be positive")

    @property
    def patches(self) -> int:
        """ViT's sequence: one token per patch, plus CLS."""
        return (self.image_size // self.patch_size) ** 2 + 1

    def tensors(self, seq: int) -> list[tuple[int, ...]]:
        """Every parameter tensor's shape."""
        embed, layer, final, head = self.pieces(seq)
        return embed + layer * self.layers + final + head

    def part_counts(self, seq: int) -> dict[str, int]:
        """Parameters of the parts FSDP units are made of: ``embed`` (every embedding),
        ``layer`` (one layer), ``norm`` (the final norm) and ``head`` (what follows it;
        nothing for a head tied to the embedding)."""
        embed, layer, final, head = self.pieces(seq)
        return {
            name: sum(_numel(t) for t in part)
            for name, part in (("embed", embed), ("layer", layer), ("norm", final), ("head", head))
        }

    def pieces(
        self, seq: int
    ) -> tuple[
        list[tuple[int, ...]], list[tuple[int, ...]], list[tuple[int, ...]], list[tuple[int, ...]]
    ]:
        """The parameter shapes of the embeddings, of one layer, of the final norm and of
        the head, in the model's order."""
        h, f, v = self.hidden, self.intermediate or 0, self.vocab
        d = self.head_dim or h // self.heads
        q, kv = self.heads * d, (self.kv_heads or self.heads) * d
        lin: list[tuple[int, ...]] = [(h, h), (h,)]  # a Linear(h, h) with bias
        ln: list[tuple[int, ...]] = [(h,), (h,)]
        qkv: list[tuple[int, ...]] = [(q + 2 * kv, h), (q + 2 * kv,)]  # fused, with its bias
        out: list[tuple[int, ...]]
        layer: list[tuple[int, ...]]
        final: list[tuple[int, ...]]
        if self.arch == "gpt":
            out = [(v, h), (self.max_positions or seq, h)]
            layer = [*ln, *qkv, (h, q), (h,), *ln, (f, h), (f,), (h, f), (h,)]
            final = ln
        elif self.arch == "llama":
            out = [(v, h)]
            proj = [(q, h), (q,), (kv, h), (kv,), (kv, h), (kv,)]
            if not self.qkv_bias:
                proj = [t for t in proj if len(t) == 2]
            layer = [(h,), *proj, (h, q), (h,), (f, h), (f, h), (h, f)]
            final = [(h,)]
        elif self.arch in ("bert", "roberta"):
            out = [(v, h), (self.max_positions or seq, h), (self.type_vocab or 1, h), *ln]
            layer = [*lin, *lin, *lin, *lin, *ln, (f, h), (f,), (h, f), (h,), *ln]
            final = []
        elif self.arch == "neox":
            out = [(v, h)]
            layer = [*ln, *ln, *qkv, (h, q), (h,), (f, h), (f,), (h, f), (h,)]
            final = ln
        elif self.arch == "falcon":
            out = [(v, h)]
            layer = [*ln * self.layer_norms, (q + 2 * kv, h), (h, q), (f, h), (h, f)]
            final = ln
        else:  # vit
            p, c = self.patch_size, self.channels
            out = [(1, 1, h), (1, self.patches, h), (h, c, p, p), (h,)]
            layer = [*ln, *lin, *lin, *lin, *lin, *ln, (f, h), (f,), (h, f), (h,)]
            final = ln
        head: list[tuple[int, ...]] = []
        if self.head == "lm" and not self.tied:
            head.append((v, h))
        elif self.head == "mlm":
            head += [*lin, *ln, (v,)]  # transform, LayerNorm, the decoder's own bias
            if not self.tied:
                head.append((v, h))
        elif self.head == "pooler":
            head += lin
        elif self.head == "classifier":
            head += [(self.labels, h), (self.labels,)]
        return out, layer, final, head

    def count(self, seq: int) -> int:
        """Parameters in all."""
        return sum(_numel(s) for s in self.tensors(seq))

    def lora_tensors(
        self, rank: int, targets: tuple[str, ...] = ("q", "v")
    ) -> list[tuple[int, ...]]:
        """LoRA's A and B for each targeted role in every layer (PEFT's default: q and v).

        A fused QKV matrix (GPT-2, GPT-NeoX) is one module: any of q, k, v adapts it."""
        h, f = self.hidden, self.intermediate or 0
        d = self.head_dim or h // self.heads
        q, kv = self.heads * d, (self.kv_heads or self.heads) * d
        dims = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h)}
        dims.update({"gate": (h, f), "up": (h, f), "down": (f, h)})
        if self.arch in ("gpt", "neox", "falcon"):
            dims = {"q": (h, q + 2 * kv), "o": (q, h), "up": (h, f), "down": (f, h)}
            targets = tuple("q" if t in ("q", "k", "v") else t for t in targets)
        if self.arch != "llama":
            dims.pop("gate", None)
        per: list[tuple[int, ...]] = []
        for role in dict.fromkeys(targets):
            if role in dims:
                n_in, n_out = dims[role]
                per += [(rank, n_in), (n_out, rank)]
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


@dataclass
class FromConfig:
    """What a config says: the shape, the settings it implies, and what was assumed.

    Attributes:
        shape: The model's shape.
        seq: The sequence length the config implies (positions, or ViT's patches).
        dropout: Dropout probabilities found in the config (``attn``, ``resid``, ``embd``).
        activation: The config's activation name, if any.
        assumed: One line per assumption, for the user to check.
    """

    shape: ModelShape
    seq: int | None
    dropout: dict[str, float]
    activation: str | None
    assumed: list[str]


_HEAD_SUFFIXES = (
    ("ForMaskedLM", "mlm"),
    ("ForCausalLM", "lm"),
    ("LMHeadModel", "lm"),
    ("ForImageClassification", "classifier"),
    ("Model", "pooler"),
)


def _pick(config: dict[str, Any], key: str) -> int | None:
    """The config's integer for ``key`` under any of its names (:data:`CONFIG_NAMES`)."""
    for name in CONFIG_NAMES[key]:
        v = config.get(name)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _layout(config: dict[str, Any], arch: str | None, assumed: list[str]) -> str:
    """The layout of :data:`ARCHS` the config's ``model_type`` (or ``arch``) names."""
    model_type = str(config.get("model_type") or "")
    layout = arch or MODEL_TYPES.get(model_type)
    if layout is None:
        known = ", ".join(MODEL_TYPES)
        what = f"model_type {model_type!r}" if model_type else "no model_type"
        raise ValueError(
            f"config has {what}; estimate lists the parameters of {known} exactly:"
            " give --arch to use one of their layouts, or --trace MODULE:FUNCTION"
        )
    needed = ("layers", "hidden", "heads") + (() if layout == "vit" else ("vocab",))
    missing = [k for k in needed if _pick(config, k) is None]
    if missing:
        raise ValueError(f"config has no {', '.join(missing)}")
    if arch and model_type and MODEL_TYPES.get(model_type) != arch:
        assumed.append(f"layout {arch} (--arch) for model_type {model_type!r}")
    return layout


def _head(config: dict[str, Any], layout: str) -> tuple[str | None, str]:
    """The head ``architectures[0]`` names (None: none named), and that name."""
    archs = config.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        return None, ""
    name = archs[0]
    head = next((h for suffix, h in _HEAD_SUFFIXES if name.endswith(suffix)), None)
    if head is None:
        raise ValueError(
            f"config architecture {name}: estimate knows the heads of ...ForMaskedLM,"
            " ...ForCausalLM, ...LMHeadModel, ...ForImageClassification and ...Model"
        )
    if head == "pooler" and layout in ("gpt", "llama", "neox"):
        head = "none"  # GPT2Model, LlamaModel: no head at all
    return head, name


def _labels(config: dict[str, Any]) -> int:
    labels = config.get("num_labels")
    if not isinstance(labels, int) or isinstance(labels, bool):
        id2label = config.get("id2label")
        labels = len(id2label) if isinstance(id2label, dict) and id2label else 2
    return int(labels)


def _falcon_heads(config: dict[str, Any]) -> tuple[int | None, int]:
    """Falcon's key/value heads and LayerNorms per layer."""
    if config.get("parallel_attn") is False or config.get("alibi"):
        raise ValueError(
            "falcon with parallel_attn false or alibi: estimate lists only Falcon's"
            " rotary, parallel-attention layout (7B, 40B, 180B); --trace would count it"
        )
    # FalconConfig: num_kv_heads only counts in the new architecture; the old one is
    # multi-query (one key/value head) unless multi_query is false.
    if not config.get("new_decoder_architecture"):
        return (1 if config.get("multi_query", True) else None), 1
    return _pick(config, "kv_heads"), 2


def _config_seq(shape: ModelShape, assumed: list[str]) -> int | None:
    """The sequence the config implies: ViT's patches, else its positions."""
    if shape.arch == "vit":
        seq: int | None = shape.patches
        assumed.append(f"sequence {seq}: ({shape.image_size}/{shape.patch_size})² patches and CLS")
        return seq
    seq = shape.max_positions
    if shape.arch == "roberta" and seq and seq > 2:
        seq -= 2  # RoBERTa's table starts after the padding index
    if seq:
        assumed.append(f"sequence length {seq} (the config's positions; --seq to change)")
    return seq


def _config_dropout(config: dict[str, Any]) -> dict[str, float]:
    dropout = {}
    for key, names in DROPOUT_NAMES.items():
        for name in names:
            v = config.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                dropout[key] = float(v)
                break
    return dropout


def shape_from_config(config: dict[str, Any], arch: str | None = None) -> FromConfig:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` dict.

    Args:
        config: The parsed config.
        arch: A layout of :data:`ARCHS` given by the user, for a config without (or with
            an unknown) ``model_type``.

    Raises:
        ValueError: A family or head this module cannot list exactly, or a config that
            lacks the shape; the message is one line for the user.
    """
    assumed: list[str] = []
    layout = _layout(config, arch, assumed)
    head, name = _head(config, layout)
    gpt_like = layout in ("gpt", "bert", "roberta", "falcon")
    tied = config.get("tie_word_embeddings")
    kv_heads, norms = _pick(config, "kv_heads"), 2
    if layout == "falcon":
        kv_heads, norms = _falcon_heads(config)
    shape = ModelShape(
        layers=_pick(config, "layers") or 0,
        hidden=_pick(config, "hidden") or 0,
        heads=_pick(config, "heads") or 0,
        vocab=_pick(config, "vocab") or 0,
        arch=layout,
        kv_heads=kv_heads,
        intermediate=_pick(config, "intermediate"),
        head_dim=_pick(config, "head_dim"),
        layer_norms=norms,
        qkv_bias=str(config.get("model_type") or "") == "qwen2",
        tied=tied if isinstance(tied, bool) else gpt_like,
        max_positions=_pick(config, "max_positions"),
        head=head,
        type_vocab=config.get("type_vocab_size") if layout in ("bert", "roberta") else None,
        image_size=int(config.get("image_size") or 224),
        patch_size=int(config.get("patch_size") or 16),
        channels=int(config.get("num_channels") or 3),
        labels=_labels(config),
    )
    assumed.append(
        f"head: {shape.head} (the config names no architecture)"
        if head is None
        else f"head: {shape.head} ({name})"
    )
    seq = _config_seq(shape, assumed)
    act = config.get("hidden_act") or config.get("activation_function")
    return FromConfig(
        shape, seq, _config_dropout(config), act if isinstance(act, str) else None, assumed
    )


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""Roles LoRA can adapt; ``attn`` names q, k, v and o, ``mlp`` gate, up and down."""

LORA_GROUPS = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}


def parse_lora_targets(text: str) -> tuple[str, ...]:
    """``q,k,v,o,mlp`` as roles; raises ValueError naming the choices."""
    out: list[str] = []
    for part in (p.strip().lower() for p in text.split(",")):
        if part in LORA_GROUPS:
            out += LORA_GROUPS[part]
        elif part in LORA_TARGETS:
            out.append(part)
        elif part in ("all", "all-linear"):
            out += LORA_TARGETS
        else:
            choices = ", ".join((*LORA_TARGETS, *LORA_GROUPS, "all-linear"))
            raise ValueError(f"--lora-targets: unknown {part!r} (of {choices})")
    return tuple(dict.fromkeys(out))


def _lora_roles(shape: ModelShape, targets: tuple[str, ...]) -> list[str]:
    """The roles the predictor's recorder adapts (``q`` stands for a fused QKV)."""
    fused = shape.arch in ("gpt", "neox", "falcon")
    roles = ["q" if fused and t in ("k", "v") else t for t in targets]
    if shape.arch != "llama":
        roles = [r for r in roles if r != "gate"]
    return list(dict.fromkeys(roles))


_LAYOUT = {
    # arch -> (norm, mlp, fused_qkv, rope, learned positions, bias)
    "gpt": ("layernorm", "gelu", True, False, True, True),
    "llama": ("rmsnorm", "gated", False, True, False, False),
    "bert": ("layernorm", "gelu", False, False, True, True),
    "roberta": ("layernorm", "gelu", False, False, True, True),
    "neox": ("layernorm", "gelu", True, True, False, True),
    "falcon": ("layernorm", "gelu", True, True, False, False),
    "vit": ("layernorm", "gelu", False, False, True, True),
}


def _transformer_facts(
    shape: ModelShape,
    attention: str,
    dropout: dict[str, float] | None,
    lora_rank: int,
    lora_targets: tuple[str, ...],
    activation: str | None,
) -> dict[str, Any]:
    """The ``transformer`` facts of a shape (``docs/facts.md``)."""
    roles = ("q", "k", "v", "o", "gate", "up", "down", "norm", "embed", "head")
    norm, mlp, fused, rope, learned, bias = _LAYOUT[shape.arch]
    lm = shape.head in ("lm", "mlm")
    tf: dict[str, Any] = {
        "source": "estimate",
        "model_type": shape.arch,
        "layers": shape.layers,
        "hidden": shape.hidden,
        "heads": shape.heads,
        "kv_heads": shape.kv_heads,
        "intermediate": shape.intermediate,
        "vocab": shape.vocab if lm else 0,
        "head": shape.head,
        "attention": attention,
        "norm": norm,
        "norm_upcast": norm == "rmsnorm",
        "mlp": mlp,
        "fused_qkv": fused,
        "rope": rope,
        "softmax_fp32": shape.arch == "llama",
        "learned_positions": learned,
        "tied_embeddings": bool(shape.tied),
        "bias": bias,
        "dropout": {k: float(v) for k, v in (dropout or {}).items()},
        "trainable": {r: not lora_rank for r in roles},
        **(
            {"lora": {"rank": lora_rank, "targets": _lora_roles(shape, lora_targets)}}
            if lora_rank
            else {}
        ),
    }
    if activation:
        tf["activation"] = activation
    if shape.head == "mlm":
        tf["head_transform"] = True
    if shape.arch in ("neox", "falcon"):
        tf["parallel_residual"] = True
    if shape.arch == "neox":
        tf["rope_cat"] = True  # GPTNeoX's apply_rotary_pos_emb, whatever rotary_pct
    if shape.arch == "falcon":
        tf["expand_kv"] = True  # FalconAttention._split_heads, before any kernel
        tf["causal_mask"] = True  # FalconModel: allow_is_causal_skip=False
        if shape.layer_norms == 1:
            tf["shared_norm"] = True
        if shape.kv_heads == 1 and shape.layer_norms == 1:
            tf["broadcast_kv"] = True  # the old architecture's multi-query K/V
    if shape.head_dim != shape.hidden // shape.heads:
        tf["head_dim"] = shape.head_dim
    if shape.arch == "vit":
        tf["image"] = {
            "channels": shape.channels,
            "size": shape.image_size,
            "patch": shape.patch_size,
            "labels": shape.labels,
        }
    return tf


def _params_facts(
    base: list[tuple[int, ...]],
    adapters: list[tuple[int, ...]],
    trainable: list[tuple[int, ...]],
    dtype: str,
    elt: int,
) -> dict[str, Any]:
    """The ``params`` facts: the model's tensors in one group, LoRA's adapters in another."""
    base_count = sum(_numel(s) for s in base)
    adapter_count = sum(_numel(s) for s in adapters)
    count = base_count + adapter_count
    t_count = sum(_numel(s) for s in trainable)
    groups = [
        {
            "dtype": dtype,
            "device": "cuda:0",
            "trainable": trainable is base,
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
    return {
        "count": count,
        "bytes": count * elt,
        "trainable_count": t_count,
        "trainable_bytes": t_count * elt,
        "frozen_count": count - t_count,
        "frozen_bytes": (count - t_count) * elt,
        "groups": groups,
    }


def _optimizer_facts(
    optimizer: str, impl: str, trainable: list[tuple[int, ...]], elt: int, dtype: str
) -> dict[str, Any]:
    """The ``optimizer`` facts: one param group of the trainable tensors, no state yet."""
    kind, extra = ESTIMATE_OPTIMIZERS[optimizer]
    return {
        "class": KINDS[kind].cls,
        "module": KINDS[kind].module,
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
    }


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
    checkpoint_every: int = 1,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = ("q", "v"),
    dropout: dict[str, float] | None = None,
    activation: str | None = None,
    tensors: tuple[tuple[int, ...], ...] = (),
) -> Facts:
    """The facts a training script with this model and settings would send.

    Args:
        shape: The model's shape, or None when only ``params`` is known (then activations
            stay unknown).
        params: Parameter count, when there is no shape.
        batch, seq: The batch shape (both needed for activations).
        precision, optimizer, impl, attention: As ``gpuwatch estimate`` takes them.
        checkpointing: Activation checkpointing of every layer, or with
            ``checkpoint_every`` k of every k-th.
        lora_rank: Freeze the model and train LoRA adapters of this rank.
        lora_targets: The roles adapted (:data:`LORA_TARGETS`), q and v by default.
        dropout: Dropout probabilities (``attn``, ``resid``, ``embd``); none by default.
        activation: The MLP's activation (``gelu_new`` is recorded op by op).
        tensors: Without a shape, the parameters' shapes where known (a model built on
            the meta device), so the optimizer's buckets hold its real tensors.
    """
    if precision not in _PRECISION:
        raise ValueError(f"unknown precision {precision!r}")
    if optimizer not in ESTIMATE_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    dtype, amp = _PRECISION[precision]
    elt = _ELT[dtype]
    seq_for_positions = seq or (shape.max_positions if shape else None) or 1024
    if shape is not None:
        base = shape.tensors(seq_for_positions)
    elif tensors and params and sum(_numel(t) for t in tensors) == params:
        base = list(tensors)
    elif params and params > 0:
        base = [(int(params),)]
    else:
        raise ValueError("give --params, a shape (--layers --hidden --heads --vocab) or --config")
    adapters = shape.lora_tensors(lora_rank, lora_targets) if (shape and lora_rank) else []
    trainable = adapters if lora_rank else base
    facts: dict[str, Any] = {
        "version": 1,
        "params": _params_facts(base, adapters, trainable, dtype, elt),
        "buffers": {"count": 0, "bytes": 0, "groups": []},
        "optimizer": _optimizer_facts(optimizer, impl, trainable, elt, dtype),
        "amp": {"dtype": amp, "source": "argument" if amp else None},
        "checkpointing": {
            "enabled": checkpointing,
            "source": "argument",
            **({"every": checkpoint_every} if checkpointing and checkpoint_every > 1 else {}),
        },
    }
    if shape is not None:
        facts["transformer"] = _transformer_facts(
            shape, attention, dropout, lora_rank, lora_targets, activation
        )
    if batch and seq:
        facts["batch"] = {"shape": [batch, seq], "batch": batch, "seq": seq, "autocast": amp}
    # Built field by field as docs/facts.md has them (the nested parts are plain dicts).
    return cast(Facts, facts)
