"""The live sources of one gpuwatch process, started and stopped together.

Used by the dashboard, ``gpuwatch record`` and ``gpuwatch run``: the annotation receiver,
the host sampler and the NVML sampler all fill one :class:`~gpuwatch.session.Session`.
"""

from __future__ import annotations

from .cli import CliError
from .session import Session
from .sources.annotations import AnnotationReceiver, SocketDirUnsafe, SocketInUse
from .sources.host import HostSampler


class LiveSources:
    """Everything that feeds a live session.

    Args:
        socket: Annotation socket path (None: the default per-user path).
        interval: NVML sampling interval in seconds.
    """

    def __init__(self, socket: str | None = None, interval: float = 0.1) -> None:
        self.session = Session()
        self.receiver = AnnotationReceiver(self.session, socket)
        self.host = HostSampler(self.session, interval=max(interval, 0.1))
        self.gpu = None
        self.interval = interval

    @property
    def socket_path(self) -> str:
        return self.receiver.path

    def start(self) -> None:
        """Bind the socket and start sampling.

        Raises:
            CliError: The socket is taken by another gpuwatch or its directory is unsafe.
        """
        try:
            self.receiver.bind()
        except (SocketInUse, SocketDirUnsafe) as exc:
            raise CliError(str(exc))
        except OSError as exc:
            raise CliError(f"cannot listen on {self.receiver.path}: {exc.strerror or exc}")
        self.receiver.start()
        self.host.start()
        from .sources.gpu import GpuSampler

        self.gpu = GpuSampler(self.session, interval=self.interval)
        self.gpu.start()

    def stop(self) -> None:
        """Stop every source and release the socket."""
        if self.gpu is not None:
            self.gpu.stop()
        self.host.stop()
        self.receiver.stop()

    def describe(self) -> str:
        """One line for the status bar."""
        return f"socket {self.socket_path}"
