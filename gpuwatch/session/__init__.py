"""The in-memory session: columnar series, phase spans, marks and range queries."""

from .model import HOST, Device, Mark, Oom, OpenSpan, gpu_key, is_host, norm_uuid, origin_key
from .process import Process
from .session import Session
from .table import MISSING_INT, Table

__all__ = [
    "HOST",
    "MISSING_INT",
    "Device",
    "Mark",
    "Oom",
    "OpenSpan",
    "Process",
    "Session",
    "Table",
    "gpu_key",
    "is_host",
    "norm_uuid",
    "origin_key",
]
