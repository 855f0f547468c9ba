"""A Hugging Face ``config.json``'s model without its memory: counted and traced.

For the families ``estimate`` has no closed form for (Mixtral and other mixtures of
experts, T5, Gemma, Phi, ...) ``transformers`` builds the model: on the meta device to
count its parameters, and on fake tensors (``FakeTensorMode``: shapes and dtypes, no
memory) to run one training forward and backward at the planned batch, sequence,
precision, attention and checkpointing. What autograd saves is counted by the very
meter a live run uses (:class:`~gpuwatch.instrument._activations.Meter`), so the
``activations`` facts it returns are those a real run would send, and the live
predictor turns them into each phase's activations and temporaries.

A full-size trace walks every layer (tens of seconds on a loaded machine), so the model
is traced with two layers per stack and once more with one layer added to each stack in
turn; the per-layer difference is then repeated up to the config's depth (each layer of
a stack is the same module, so what it saves is too). Mixtures of experts route tokens
by their values, which fake tensors do not have: the experts run as transformers'
eager loop does, with the ``top_k`` choices of the tokens dealt evenly across experts.
What each expert saves is linear in its tokens, so the total saved does not depend on
the routing; only the largest expert's transients do.

Imports torch and transformers only when called.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")
"""Config keys that count a stack's layers (T5: the encoder's and the decoder's)."""

BASE_LAYERS = 2
"""Layers per stack in the base trace: the meter lists a stack's layers one by one only
from two of them up (and only the longest stack's: the first stack gets one more for each
other stack, so that no other stack outgrows it when a layer is added to it)."""

FULL_TRACE_LAYERS = 4
"""Stacks this shallow in all are traced whole."""

EXPERTS_IMPL = "gpuwatch_even"
"""The experts implementation registered for the trace (tokens dealt evenly)."""

_SUMMED = ("bytes", "saved_bytes", "tensors", "amp_copy_bytes", "grad_bytes", "recompute_bytes")
_PEAKS = ("forward_peak", "loss_peak")

T = TypeVar("T")

Traced = tuple[dict[str, Any], list[str]]
"""A trace's ``activations`` facts, and what it assumed."""
Step = Callable[[dict[str, Any]], Traced]
"""One traced training step of a config's model, the run's settings bound (:func:`_step`)."""


def _config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(config["model_type"], **fields)


def build(config: dict[str, Any]) -> Any:
    """The config's model (``architectures[0]`` where transformers has it, else the
    causal LM, else the sequence-to-sequence LM, else the image classifier, else the bare
    model), on whatever device or mode is active.

    Raises:
        Exception: Whatever transformers raises for a config it cannot build.
    """
    import transformers
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageClassification,
        AutoModelForSeq2SeqLM,
    )

    cfg = _config(config)
    archs = config.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs else None
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is not None:
        return cls(cfg)
    for auto in (AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForImageClassification):
        try:
            return auto.from_config(cfg)
        except ValueError:  # not a family this head takes
            pass
    return AutoModel.from_config(cfg)


def _on_meta(config: dict[str, Any], use: Callable[[Any], T]) -> T | None:
    """``use`` of the config's model built on the meta device (no memory, no weights, no
    network), still on it; None where torch or transformers is missing, or the model
    cannot be built or used so (a config transformers does not know, a vision family
    whose embeddings want more than the pixels)."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                return use(build(config))
    except Exception:
        return None


def meta_count(
    config: dict[str, Any],
) -> tuple[int, str, tuple[tuple[int, ...], ...]] | None:
    """Every parameter of the config's model, built on the meta device by ``transformers``
    (no memory, no weights, no network): ``(count, class name, shapes)``, or None where
    ``transformers`` is missing or does not know the family."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return None
    model = _on_meta(config, lambda model: model)
    if model is None:
        return None
    # parameters() yields a tied tensor once, as it is held once.
    shapes = tuple(tuple(p.shape) for p in model.parameters())
    return sum(p.numel() for p in model.parameters()), type(model).__name__, shapes


def layer_counts(config: dict[str, Any]) -> dict[str, int]:
    """The config's stacks: key -> layers (T5's decoder defaults to its encoder's)."""
    out = {k: v for k in LAYER_KEYS if isinstance(v := config.get(k), int) and v > 0}
    if config.get("is_encoder_decoder") and "num_layers" in out:
        out.setdefault("num_decoder_layers", out["num_layers"])
    return out


def _even_experts(self: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """transformers' eager experts loop with the ``top_k`` choices of the tokens dealt
    evenly across the experts (fake tensors have no values to route by)."""
    import torch
    from torch.nn import functional as F

    tokens, top_k = top_k_index.shape[0], top_k_index.shape[-1]
    experts = int(self.num_experts)
    share, extra = divmod(tokens * top_k, experts)
    out = torch.zeros_like(hidden)
    start = 0
    for e in range(experts):
        n = share + (1 if e < extra else 0)
        if n == 0:
            continue  # an expert no token chose does not run
        picks = torch.arange(start, start + n, device=hidden.device)
        start += n
        token_idx, top_k_pos = picks % tokens, picks // tokens
        current = hidden[token_idx]
        up = self.gate_up_proj[e] if self.has_gate else self.up_proj[e]
        h = current @ up if self.is_transposed else F.linear(current, up)
        if self.has_bias:
            h = h + (self.gate_up_proj_bias[e] if self.has_gate else self.up_proj_bias[e])
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        down = self.down_proj[e]
        h = h @ down if self.is_transposed else F.linear(h, down)
        if self.has_bias:
            h = h + self.down_proj_bias[e]
        h = h * top_k_weights[token_idx, top_k_pos, None]
        out.index_add_(0, token_idx, h.to(out.dtype))
    return out


def _route_evenly(model: Any) -> bool:
    """Switch the model's experts (where it has them) to :func:`_even_experts`."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return False
    # The attribute use_experts_implementation gives each experts module it wraps.
    if not any(hasattr(m, "_is_expert_parallel") for m in model.modules()):
        return False
    ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPL, _even_experts)
    model.set_experts_implementation(EXPERTS_IMPL)
    return True


@contextmanager
def _unpacked_rows() -> Iterator[bool]:
    """Each row of the traced batch is one sequence, as it is in the run.

    transformers reads the position ids' values to find sequences packed into a row, and
    on fake tensors (no values) assumes them packed: it then builds a b×s×s mask, which
    keeps SDPA off its ``is_causal`` path and grouped KV heads off its GQA kernel (a
    repeat_kv copy at the full head count), where the run, with no padding mask, takes
    both. Yields whether there was anything to patch.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        yield False
        return
    find = getattr(masking_utils, "find_packed_sequence_indices", None)
    if find is None:
        yield False
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield True
    finally:
        masking_utils.find_packed_sequence_indices = find


def image_input(config: Any) -> tuple[int, int, int] | None:
    """A vision config's image as the model takes it, ``(channels, height, width)``
    (``num_channels``, ``image_size``), or None for a config with no image size."""
    size = (
        config.get("image_size")
        if isinstance(config, dict)
        else getattr(config, "image_size", None)
    )
    channels = (
        config.get("num_channels", 3)
        if isinstance(config, dict)
        else getattr(config, "num_channels", 3)
    )
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if not (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in size)
        and isinstance(channels, int)
        and channels > 0
    ):
        return None
    return channels, size[0], size[1]


def image_tokens(config: dict[str, Any]) -> int | None:
    """The tokens a vision config's layers see per image (its patches and the CLS or
    distillation tokens the family adds), from its embeddings run on the meta device; None
    for a config with no image input, or one transformers cannot build."""
    image = image_input(config)
    if image is None:
        return None

    def embedded(model: Any) -> Any:
        import torch

        embeddings = getattr(model.base_model, "embeddings", None)
        if model.main_input_name != "pixel_values" or embeddings is None:
            return None
        return embeddings(torch.zeros(1, *image))

    out = _on_meta(config, embedded)
    if out is None:
        return None
    first = out[0] if isinstance(out, tuple) else out
    shape = tuple(getattr(first, "shape", ()))
    return int(shape[1]) if len(shape) == 3 else None


def _inputs(model: Any, batch: int, seq: int, dtype: Any) -> dict[str, Any]:
    """One training batch of the model's main input, with the labels its loss wants:
    token ids (``seq`` of them) for a language model, images for a vision model (b×C×H×W
    in the weights' dtype, as the run's images reach the patch embedding; class ids for an
    image classifier)."""
    import torch

    image = image_input(model.config)
    if getattr(model, "main_input_name", "input_ids") == "pixel_values" and image is not None:
        inputs: dict[str, Any] = {"pixel_values": torch.zeros(batch, *image, dtype=dtype)}
        if type(model).__name__.endswith("ForImageClassification"):
            inputs["labels"] = torch.zeros(batch, dtype=torch.long)
        return inputs
    ids = torch.zeros(batch, seq, dtype=torch.long)
    inputs = {"input_ids": ids, "labels": ids}
    if getattr(model.config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    return inputs


@contextmanager
def _valueless_init() -> Iterator[None]:
    """transformers' ``trunc_normal_`` initialiser skipped while a model is built on fake
    tensors: torch's reads a value back (a data-dependent ``item``), which fake tensors do
    not have (ViT's position embeddings and CLS token). The values never matter there."""
    try:
        from transformers import initialization
    except ImportError:
        yield
        return
    funcs = getattr(initialization, "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(funcs, dict) or "trunc_normal_" not in funcs:
        yield
        return
    was = funcs["trunc_normal_"]
    funcs["trunc_normal_"] = lambda tensor, *args, **kwargs: tensor
    try:
        yield
    finally:
        funcs["trunc_normal_"] = was


def _step(
    config: dict[str, Any],
    batch: int,
    seq: int,
    precision: str,
    attention: str,
    checkpointing: bool,
) -> Traced:
    """One training forward and backward of the config's model on fake tensors: the
    ``activations`` facts the meter counted, and what the trace assumed."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..instrument import ActivationMeter as Meter

    notes: list[str] = []
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    amp = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    config = dict(config, attn_implementation=attention, use_cache=False)
    with warnings.catch_warnings(), _unpacked_rows(), FakeTensorMode(allow_non_fake_inputs=True):
        warnings.simplefilter("ignore")
        # Built in the weights' dtype (a cast of fake parameters cannot swap them).
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with _valueless_init():
                try:
                    model = build(config)
                except ValueError as exc:
                    # A family transformers runs only eagerly (Gemma-2: soft-capped
                    # logits) refuses SDPA by name; left to choose, transformers takes
                    # eager for it, and so does the trace.
                    if attention != "sdpa" or "scaled_dot_product_attention" not in str(exc):
                        raise
                    config = dict(config, attn_implementation="eager")
                    model = build(config)
                    notes.append(
                        f"{type(model).__name__} has no SDPA in transformers: eager attention"
                    )
        finally:
            torch.set_default_dtype(default)
        model.train()
        if _route_evenly(model):
            notes.append("experts: each token's top-k choices dealt evenly across experts")
        if checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        inputs = _inputs(model, batch, seq, dtype)
        if "pixel_values" in inputs:
            c, hgt, wid = inputs["pixel_values"].shape[1:]
            notes.append(f"each sample a {c}×{hgt}×{wid} image (the config's)")
        meter = Meter(torch, model)
        if not meter.start():
            raise RuntimeError(f"the meter did not start: {meter.error}")
        try:
            with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                out = model(**inputs)
                meter.model_returned(out)
                loss = out.loss
            loss.backward()
        finally:
            meter.stop("backward")
        facts = meter.facts()
    if facts.get("error"):
        raise RuntimeError(str(facts["error"]))
    return facts, notes


def _add(into: dict[str, Any], base: dict[str, Any], more: dict[str, Any], times: int) -> None:
    """``into`` += ``times`` x (``more`` - ``base``) for each summed field."""
    for k in _SUMMED:
        if isinstance(into.get(k), int):
            into[k] += times * (int(more.get(k) or 0) - int(base.get(k) or 0))


def _extrapolate(base: dict[str, Any], bumps: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """The full depth's facts from the base trace and traces with one layer more: each
    ``(more, times)`` adds ``more``'s per-layer difference ``times`` over (one per stack,
    or one per kind of layer where a stack mixes kinds)."""
    out = {**base, "modules": [dict(m) for m in base.get("modules") or []]}
    for peak in _PEAKS:
        if isinstance(base.get(peak), dict):
            out[peak] = dict(base[peak])
    for more, times in bumps:
        if times <= 0:
            continue
        _add(out, base, more, times)
        for peak in _PEAKS:
            if isinstance(out.get(peak), dict) and isinstance(more.get(peak), dict):
                _add(out[peak], base[peak], more[peak], times)
        was = {m["name"]: m for m in base.get("modules") or []}
        mine = {m["name"]: m for m in out["modules"]}
        for m in more.get("modules") or []:
            old = was.get(m["name"])
            if old is not None:  # a module holding the stack: its share grows
                _add(mine[m["name"]], old, m, times)
                continue
            # A layer the meter lists: repeated, numbered on, after its stack's last one.
            stem, _, index = m["name"].rpartition(".")
            if not index.isdigit():
                out["modules"].append(dict(m))
                continue
            listed = [
                i
                for i, o in enumerate(out["modules"])
                if o["name"].startswith(stem + ".") and o["name"][len(stem) + 1 :].isdigit()
            ]
            after = max(listed, default=len(out["modules"]) - 1)
            first = (
                max(int(out["modules"][i]["name"][len(stem) + 1 :]) for i in listed) + 1
                if listed
                else int(index)
            )
            copies = [dict(m, name=f"{stem}.{first + i}") for i in range(times)]
            out["modules"][after + 1 : after + 1] = copies
    return out


def layer_kinds(config: dict[str, Any]) -> list[str] | None:
    """The kind of each decoder layer where the config mixes kinds (Gemma-2/3's sliding-
    window and global attention: ``layer_types``, as transformers derives it from the
    config), else None."""
    if set(layer_counts(config)) != {"num_hidden_layers"}:
        return None
    try:
        kinds = getattr(_config(config), "layer_types", None)
    except Exception:  # a config transformers cannot read: no kinds to mix
        return None
    if not isinstance(kinds, list) or len(kinds) != config["num_hidden_layers"]:
        return None
    if not all(isinstance(k, str) for k in kinds) or len(set(kinds)) < 2:
        return None
    return kinds


def traced_activations(
    config: dict[str, Any],
    *,
    batch: int,
    seq: int,
    precision: str = "bf16-mixed",
    attention: str = "sdpa",
    checkpointing: bool = False,
    full: bool = False,
) -> Traced:
    """The ``activations`` facts of one training step of the config's model, traced on
    fake tensors (extrapolated per layer unless ``full`` or the stacks are shallow), and
    what the trace assumed.

    Raises:
        RuntimeError: transformers missing, or a model that cannot run on fake tensors
            (the message is one line for the user).
    """
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"tracing a config's activations needs transformers: {exc}")
    step: Step = functools.partial(
        _step,
        batch=batch,
        seq=seq,
        precision=precision,
        attention=attention,
        checkpointing=checkpointing,
    )
    stacks = layer_counts(config)
    kinds = layer_kinds(config)
    try:
        if full or sum(stacks.values()) <= FULL_TRACE_LAYERS:
            return step(config)
        if kinds is not None:
            return _by_kind(config, kinds, step)
        first = next(iter(stacks))
        small = {
            k: min(v, BASE_LAYERS + (len(stacks) - 1 if k == first else 0))
            for k, v in stacks.items()
        }
        base, notes = step({**config, **small})
        bumps = []
        for key, layers in stacks.items():
            if layers > small[key]:
                cfg = {**config, **small, key: small[key] + 1}
                more = step(cfg)[0]
                bumps.append((more, layers - small[key]))
    except RuntimeError:
        raise
    except Exception as exc:  # any model the fake step cannot run, in one line
        raise RuntimeError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    shown = ", ".join(f"{k} {small[k]}+1 of {v}" for k, v in stacks.items())
    notes.append(f"traced with {shown} layers and the per-layer difference repeated")
    return _extrapolate(base, bumps), notes


def _by_kind(config: dict[str, Any], kinds: list[str], step: Step) -> Traced:
    """A stack mixing kinds of layer (Gemma-2/3), extrapolated kind by kind: a base of
    one layer of each kind (what the model builds once per kind, a shared mask, is in
    it), then one trace per kind with one layer of it more, each kind's difference
    repeated for the config's other layers of that kind."""
    distinct = list(dict.fromkeys(kinds))
    base_kinds = distinct + kinds[: max(0, BASE_LAYERS - len(distinct))]
    layers = len(kinds)

    def with_kinds(these: list[str]) -> dict[str, Any]:
        return {**config, "num_hidden_layers": len(these), "layer_types": these}

    base, notes = step(with_kinds(base_kinds))
    bumps = []
    for kind in distinct:
        times = kinds.count(kind) - base_kinds.count(kind)
        if times > 0:
            cfg = with_kinds([*base_kinds, kind])
            bumps.append((step(cfg)[0], times))
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in distinct)
    notes.append(
        f"traced with {len(base_kinds)} layers and one more of each kind, each kind's"
        f" per-layer difference repeated to its count ({counts} of {layers} layers)"
    )
    return _extrapolate(base, bumps), notes
