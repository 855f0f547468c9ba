"""One datagram, checked where it is read, and packed for the pipe to the receiver.

The relay (``_batch.relay``) validates every datagram in its own process and sends on the
result, not the datagram: gpuwatch's process only unpacks it (``marshal``, a fifth of
the cost of decoding and checking the JSON) and applies it. Under a fork storm that
process gets a small share of the CPU (the kernel schedules it in the storm's group,
while the relay has a group of its own), and validation was a third of what it spent on
each datagram (``docs/architecture.md``, "A phase event").

Imports the protocol and the standard library only: the relay starts with nothing else.
"""

from __future__ import annotations

import marshal

from ..protocol import MAX_DATAGRAM, Message, ProtocolError, decode

Rejected = tuple[str, "int | None"]
"""Why a datagram was refused (a :class:`~gpuwatch.protocol.ProtocolError` reason, or
``"internal"``) and the sequence number it carried, when it had a valid one."""


def checked(data: bytes, sender: int | None, now: int) -> Message | Rejected:
    """The message of one datagram, or why it is refused; never raises.

    Args:
        data: The datagram (longer than :data:`~gpuwatch.protocol.MAX_DATAGRAM`: truncated
            on receipt, refused for its size).
        sender: The sending process's pid as the kernel reports it (0: not visible in this
            PID namespace); None only where no socket carried it (tests): the claimed pid
            stands. A claimed pid that differs is kept as ``container_pid``.
        now: The reader's ``time.monotonic_ns()``, for the time check.
    """
    try:
        if len(data) > MAX_DATAGRAM:
            raise ProtocolError("size")
        if sender is not None and sender <= 0:
            raise ProtocolError("identity", "sender not in this PID namespace")
        msg = decode(data, now=now)
    except ProtocolError as exc:
        return exc.reason, exc.seq
    except Exception:
        return "internal", None
    if sender is not None and sender != msg.pid:
        msg.container_pid = msg.pid
        msg.pid = sender
    return msg


def pack(data: bytes, sender: int | None, now: int) -> bytes:
    """What the relay sends on for one datagram: :func:`checked`'s result, marshalled."""
    item = checked(data, sender, now)
    if type(item) is tuple:
        return marshal.dumps(item)
    m = item
    try:
        return marshal.dumps((m.kind, m.pid, m.seq, m.t, m.dropped, m.body, m.container_pid))
    except ValueError:  # a value marshal cannot hold (none that JSON gives)
        return marshal.dumps(("internal", None))


def unpack(payload: bytes | memoryview) -> Message | Rejected:
    """:func:`pack`'s result back (from gpuwatch's own relay, on a private pipe).

    Raises:
        ValueError, EOFError, TypeError: The payload is not one :func:`pack` made.
    """
    item = marshal.loads(payload)
    if len(item) == 2:
        reason, seq = item
        return str(reason), seq if type(seq) is int else None
    return Message(*item)
