"""GPUs by name, and what ``--gpus`` means: how many, and how much memory each offers.

Capacities are the totals ``nvidia-smi`` reports for each card (``memory.total``), from
the vendors' spec sheets; what a training process can allocate is that less the CUDA
context and NCCL's buffers, which torch's allocator never sees, and cuBLAS's workspaces,
which it allocates (:data:`DEFAULT_RESERVE`, ``--reserve``, covers them all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

GPUS: dict[str, int] = {
    "A100-40GB": 40960 * MIB,
    "A100-80GB": 81920 * MIB,
    "H100-80GB": 81559 * MIB,
    "H100-94GB": 95830 * MIB,
    "H200": 143771 * MIB,
    "B200": 183359 * MIB,
    "L4": 23034 * MIB,
    "L40S": 46068 * MIB,
    "A10": 23028 * MIB,
    "A10G": 23028 * MIB,
    "A6000": 49140 * MIB,
    "RTX-4090": 24564 * MIB,
    "RTX-3090": 24576 * MIB,
    "V100-16GB": 16384 * MIB,
    "V100-32GB": 32768 * MIB,
    "T4": 15360 * MIB,
}
"""Card -> total memory in bytes, as ``nvidia-smi`` reports it."""

DEFAULT_RESERVE = 1 * GIB
"""Bytes of each GPU that torch's allocator cannot have: the CUDA context (about 0.3-0.6
GiB with cuDNN and cuBLAS loaded), NCCL's communicator buffers and cuBLAS's workspaces (one
per thread that runs a matmul, from torch's allocator: the live predictor counts them from
the facts' ``blas``, an estimate leaves them to this reserve)."""

_UNITS = {"gib": GIB, "gb": 10**9, "mib": MIB, "mb": 10**6, "tib": 1 << 40, "tb": 10**12}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY = {_key(k): k for k in GPUS}


def parse_gpu_size(text: str) -> int | None:
    """``80GiB``, ``80GB``, ``24576MiB`` as bytes; None when it is not a size."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]+)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        return None
    value = round(float(m.group(1)) * _UNITS[m.group(2).lower()])
    return value if value > 0 else None


@dataclass(frozen=True)
class Gpus:
    """The GPUs a run is planned on.

    Attributes:
        count: GPUs per node.
        name: The card's name, or the size as given.
        total: Each GPU's memory in bytes.
    """

    count: int
    name: str
    total: int

    def usable(self, reserve: int = DEFAULT_RESERVE) -> int:
        """What torch's allocator can have of each GPU."""
        return max(self.total - reserve, 0)


def parse_gpus(text: str) -> Gpus:
    """``4xA100-80GB``, ``4x80GiB``, ``H100-80GB`` (one), ``2 x RTX 4090``.

    Raises:
        ValueError: One line naming what would be accepted.
    """
    m = re.fullmatch(r"\s*(?:([0-9]+)\s*[xX×*]\s*)?(.+?)\s*", text)
    count = int(m.group(1)) if m and m.group(1) else 1
    what = m.group(2) if m else text
    if count <= 0 or count > 4096:
        raise ValueError(f"--gpus {text!r}: the count must be 1 to 4096")
    size = parse_gpu_size(what)
    if size is not None:
        return Gpus(count, what.strip(), size)
    name = _BY_KEY.get(_key(what))
    if name is None:
        raise ValueError(
            f"--gpus {text!r}: unknown GPU; give N x a size (4x80GiB) or one of " + ", ".join(GPUS)
        )
    return Gpus(count, name, GPUS[name])
