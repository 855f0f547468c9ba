"""The live sources of one gpuwatch process, started and stopped together.

Used by the dashboard, ``gpuwatch record`` and ``gpuwatch run``: the annotation receiver,
the host sampler and the NVML sampler all fill one :class:`~gpuwatch.session.Session`;
the recorder and the Prometheus exporter (``--prometheus``) read it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .session import Session
from .sources.annotations import AnnotationReceiver, SocketError, SocketInUse, lock_owner
from .sources.host import HostSampler

if TYPE_CHECKING:  # imported when started: the dashboard's first frame does not wait on them
    from .prometheus import MetricsServer
    from .sources.gpu_process import GpuProcess
    from .store.recorder import Recorder

RANKS_EVERY = 1.0
"""Seconds between two looks at the ranks for faults to mark (see :class:`RankMarks`)."""


class SourcesError(RuntimeError):
    """The live sources cannot start; ``str()`` is one line that says why and what to do."""


class LiveSources:
    """Everything that feeds a live session.

    Args:
        socket: Annotation socket path (None: the default per-user path).
        interval: NVML sampling interval in seconds.
    """

    def __init__(self, socket: str | None = None, interval: float = 0.1) -> None:
        self.session = Session()
        self.session.bound()  # memory stays flat: the recording is the archive
        self.receiver = AnnotationReceiver(self.session, socket)
        self.host = HostSampler(self.session, interval=max(interval, 0.1))
        self.gpu: GpuProcess | None = None
        self.interval = interval
        self.recorder: Recorder | None = None  # while recording
        self.record_path: Path | None = None
        self._record: dict[str, Any] | None = None
        self.metrics: MetricsServer | None = None  # while serving
        self._metrics_at: tuple[str, int] | None = None
        self._ranks_stop = threading.Event()
        self._ranks: threading.Thread | None = None
        self.rank_check_failures = 0  # looks at the ranks that raised (the first is noted)

    def record_to(
        self,
        path: str | os.PathLike[str],
        *,
        label: str = "",
        overwrite: bool = False,
        optional: bool = False,
    ) -> None:
        """Record the session to ``path`` once started.

        Args:
            path: The recording to create.
            label: Its ``meta.label``.
            overwrite: Replace an existing file.
            optional: A file that cannot be created is a note in the session, not an error.
        """
        self.record_path = Path(path)
        self._record = {"label": label, "overwrite": overwrite, "optional": optional}

    def serve_metrics(self, host: str, port: int) -> None:
        """Serve Prometheus metrics on ``host:port`` once started (port 0: any free one)."""
        self._metrics_at = (host, port)

    @property
    def socket_path(self) -> str:
        return self.receiver.path

    def start(self) -> None:
        """Bind the socket and start sampling.

        Raises:
            SourcesError: The socket is taken by another gpuwatch or its directory is unsafe.
        """
        try:
            self.receiver.bind()
        except SocketInUse as exc:
            # Another gpuwatch (not another program) holds it: say what to do instead.
            another = str(exc).startswith("another gpuwatch")
            raise SourcesError(f"{exc}. {self._advice_when_taken()}" if another else str(exc))
        except SocketError as exc:
            raise SourcesError(str(exc))
        except OSError as exc:
            raise SourcesError(f"cannot listen on {self.receiver.path}: {exc.strerror or exc}")
        # After the socket (a second gpuwatch fails there), before the recorder (a port in
        # use leaves no file behind) and the samplers (nothing is missed).
        self._start_metrics()
        self._start_recorder()
        self._publish_recording()
        self.receiver.start()
        self.host.start()
        from .sources.gpu_process import GpuProcess

        self.gpu = GpuProcess(self.session, interval=self.interval)
        self.gpu.start()
        self._ranks = threading.Thread(target=self._mark_ranks, name="gpuwatch-ranks", daemon=True)
        self._ranks.start()

    def _mark_ranks(self) -> None:
        """Mark a stray context or diverging step counters of a job's ranks once, when seen."""
        from .analysis.rank_feed import RankMarks

        marks = RankMarks()
        stopping = False
        while not stopping:
            # A last look when asked to stop: a fault the screen showed in the last second
            # is in the recording too.
            stopping = self._ranks_stop.wait(RANKS_EVERY)
            try:
                marks.check(self.session)
            except Exception as exc:  # tried again next time; the sources go on
                self.rank_check_failures += 1
                if self.rank_check_failures == 1:  # said once, not each second
                    self.session.note(
                        f"cannot look at the ranks for faults ({type(exc).__name__}): "
                        "their marks may be missing"
                    )

    def _start_metrics(self) -> None:
        if self._metrics_at is None:
            return
        from .prometheus import MetricsServer, host_port  # prometheus_client only if asked

        host, port = self._metrics_at
        server = MetricsServer(self.session, host, port, gone=self.host.gone)
        try:
            server.start()
        except OSError as exc:
            self.receiver.stop()
            reason = exc.strerror or str(exc)
            raise SourcesError(f"cannot serve metrics on {host_port(host, port)}: {reason}")
        self.metrics = server

    def _start_recorder(self) -> None:
        if self._record is None or self.record_path is None:
            return
        import sqlite3

        from .store import Recorder

        options = dict(self._record)
        optional = options.pop("optional")
        try:
            self.recorder = Recorder(self.session, self.record_path, **options)
        except (OSError, sqlite3.Error) as exc:
            message = (
                f"cannot record to {self.record_path}: {getattr(exc, 'strerror', None) or exc}"
            )
            if not optional:
                self.receiver.stop()
                if self.metrics is not None:
                    self.metrics.stop()
                raise SourcesError(message)
            self.session.note(f"not recording: {message}")
            self.record_path = None
            return
        self.recorder.start()

    # ------------------------------------------------------------------ a second gpuwatch

    def _publish_recording(self) -> None:
        path = self.record_path if self.recorder is not None else None
        self.receiver.announce(str(path.resolve()) if path is not None else None)

    def _advice_when_taken(self) -> str:
        """What to do instead of a second dashboard on a taken socket."""
        other = os.path.join(os.path.dirname(self.socket_path) or ".", "other.sock")
        separate = (
            f"for a separate dashboard, give this one its own socket: gpuwatch --socket {other} "
            f"(and GPUWATCH_SOCKET={other} for the scripts it should watch)"
        )
        _, path = lock_owner(self.socket_path)
        path = path or ""
        # The first gpuwatch wrote it, in a lock file of this user's; still, print only a
        # plain absolute path.
        if path.startswith("/") and len(path) <= 4096 and path.isprintable():
            import shlex

            return (
                "To watch its session, replay its recording as it grows: "
                f"gpuwatch replay {shlex.quote(path)}; {separate}"
            )
        return f"It records to no file; {separate}"

    def stop(self) -> None:
        """Stop every source and release the socket; finish the recording.

        The receiver first records what senders have sent (a few seconds at most, see
        :meth:`AnnotationReceiver.stop`): a second Ctrl-C meanwhile still finishes the file.
        """
        self._ranks_stop.set()
        if self._ranks is not None:
            self._ranks.join(timeout=2)
        if self.gpu is not None:
            self.gpu.stop()
        self.host.stop()
        try:
            self.receiver.stop()
        finally:
            if self.metrics is not None:
                self.metrics.stop()
            if self.recorder is not None:
                self.recorder.close()

    def warning(self) -> str | None:
        """What the status bar must always show: a recording that stopped, else None."""
        if self.recorder is not None and self.recorder.error is not None:
            return f"NOT RECORDING ({self.recorder.cause})"
        return None

    def describe(self, *, warning: bool = True) -> str:
        """One line for the status bar: the recording first (a narrow terminal cuts the end,
        and scripts find the socket without reading it). ``warning=False``: a recording
        that stopped is left to :meth:`warning` (the dashboard shows it among its
        warnings, which never give way)."""
        if self.recorder is not None and self.recorder.error is None:
            path = str(self.record_path)
            home = os.path.expanduser("~")
            if path.startswith(home + os.sep):
                path = "~" + path[len(home) :]
            text = f"recording {path}"
        elif self.recorder is not None:
            text = f"NOT RECORDING ({self.recorder.cause})" if warning else "not recording"
        else:
            text = "not recording"
        if self.metrics is not None:
            text += f" · metrics {self.metrics.url}"
        return text + f" · socket {self.socket_path}"
