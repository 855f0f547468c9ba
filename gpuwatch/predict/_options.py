"""What ``gpuwatch estimate`` (and ``gpuwatch.plan``) is asked: its options, typed.

The command line parses them with argparse; a notebook passes them as keywords
(:func:`options_from_keywords`). Either way :func:`~._estimate.estimate` gets one
:class:`Options` and checks what argparse would have checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

SCALE = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
"""``--params 7B``: the suffixes model cards use (thousand, million, billion, trillion)."""


class EstimateError(ValueError):
    """Options or a model the estimate cannot take; the message is one line for the user."""


def parse_positive(text: str) -> int:
    """A positive whole number (``1e3`` too).

    Raises:
        ValueError: Not a number, or not positive.
    """
    try:
        value = int(float(text))
    except (ValueError, OverflowError):  # OverflowError: inf
        raise ValueError(f"not a number: {text!r}") from None
    if value <= 0:
        raise ValueError(f"must be positive: {text!r}")
    return value


def parse_count(text: str) -> int:
    """``--params``: ``124M``, ``7B``, ``1.3b``, ``175e9`` or a plain count.

    Raises:
        ValueError: Not a count, or not positive.
    """
    scale = SCALE.get(text.strip()[-1:].lower(), 1)
    number = text.strip()[:-1] if scale != 1 else text
    try:
        value = round(float(number) * scale)
    except (ValueError, OverflowError):
        raise ValueError(f"not a count (e.g. 124M, 7B, 1.3e9): {text!r}") from None
    if value <= 0:
        raise ValueError(f"must be positive: {text!r}")
    return value


def parse_probability(text: str) -> float:
    """A probability in ``[0, 1)``.

    Raises:
        ValueError: Not a number, or out of range.
    """
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise ValueError(f"must be in [0, 1): {text!r}")
    return value


@dataclass
class Options:
    """``gpuwatch estimate``'s options, by their long names (``-`` as ``_``).

    None means "not given": the estimate assumes a default and says so in ``assumed``.
    """

    params: int | None = None
    config: str | None = None
    arch: str | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    image_size: int | None = None
    patch_size: int | None = None
    seq: int | None = None
    batch: int | None = None
    precision: str | None = None
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    attention: str = "sdpa"
    dropout: float | None = None
    checkpointing: bool = False
    checkpoint_every: int = 1
    lora_rank: int = 0
    lora_targets: str = "q,v"
    qlora: bool = False
    accumulation: int = 1
    gpus: str | None = None
    nodes: int = 1
    layout: str | None = None
    offload: bool = False
    reserve: str = "1GiB"
    fsdp_units: str | None = None
    mp_policy: str | None = None
    loss: str = "inside"
    device: str = "cuda"

    @classmethod
    def from_values(cls, values: object) -> Options:
        """The options from an object with one attribute per field (argparse's
        namespace); attributes it lacks keep their defaults."""
        defaults = cls()
        return cls(
            **{f.name: getattr(values, f.name, getattr(defaults, f.name)) for f in fields(cls)}
        )


_PARSERS: dict[str, Callable[[str], object]] = {
    "params": parse_count,
    "dropout": parse_probability,
    **{
        name: parse_positive
        for name in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "head_dim",
            "intermediate",
            "vocab",
            "image_size",
            "patch_size",
            "seq",
            "batch",
            "checkpoint_every",
            "lora_rank",
            "accumulation",
            "nodes",
        )
    },
}
_SWITCHES = {"checkpointing", "qlora", "offload"}


def options_from_keywords(keywords: Mapping[str, object]) -> Options:
    """:class:`Options` from keywords as a notebook gives them (``lora_rank=16``,
    ``params="7B"``, ``checkpointing=True``); None or False leaves an option unset.

    Raises:
        EstimateError: An unknown option or a value the option does not take.
    """
    known = {f.name for f in fields(Options)}
    values: dict[str, object] = {}
    for key, value in keywords.items():
        flag = "--" + key.replace("_", "-")
        if key not in known:
            raise EstimateError(f"unknown option {flag}")
        if value is None or value is False:
            continue
        if key in _SWITCHES:
            values[key] = True
            continue
        parse = _PARSERS.get(key, str)
        try:
            values[key] = parse(str(value))
        except ValueError as exc:
            raise EstimateError(f"{flag}: {exc}") from None
    return Options(**values)  # type: ignore[arg-type]
