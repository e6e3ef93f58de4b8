"""Options every process has, as a base for each service's frozen settings dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.logging import LOG_FORMATS
from services.common.mux import DEFAULT_LINGER
from services.common.settings import option
from services.common.tls import TlsFiles

LOG_LEVELS = ("debug", "info", "warning", "error")
# The one default of --max-messages, which the gateway and the parse service both check (harnessmesh up
# gives both the same value).
DEFAULT_MAX_MESSAGES = 10_000
# Work at most this big runs on the event loop, larger work in a worker thread, so no request holds a loop for
# long (issue 14), while a thread hand-off costs ~0.2-0.5 ms of a request's time to first token (four of them, the
# gateway's two and the parse service's two, were ~0.8 ms of a cached 100k-token turn's, bench/vs_dynamo.py).
# The parse service's conversion of a request's own messages and the text it tokenizes: a few dozen messages and
# 32 KB cost well under 10 ms even for pathological text (a 32 KB run of one digit renders and tokenizes in ~2.5 ms).
INLINE_WORK_BYTES = 32 * 1024
INLINE_WORK_MESSAGES = 64
# The parse service's render of a whole conversation (a continued one: the messages it holds and the new ones),
# ~7 us a message (a 100k-token agent session of 54 messages: 0.37 ms), whatever their text.
INLINE_RENDER_MESSAGES = 256
# The gateway's validation and conversion of a request body, ~3 us a message and ~1.5 ms a MB when nothing of it
# was converted before (1 MB, 204 messages: 1.4 ms; 256 small messages: 0.7 ms); parsing the body, always on the
# loop (orjson holds the GIL throughout), costs ~0.8 ms a MB already.
INLINE_BODY_BYTES = 1 << 20
INLINE_BODY_MESSAGES = 256


@dataclass(frozen=True)
class ProcessSettings:
    """Logging and namespace options shared by every process of the mesh, the launcher included."""

    log_level: str = option("info", "Log level.", shared=True, choices=LOG_LEVELS)
    log_format: str = option("auto", "Log format: json lines, human-readable console, or auto: console when "
                             "stderr is a terminal, else json.", shared=True, choices=LOG_FORMATS)
    namespace: str = option("default", "Mesh namespace: scopes NATS subjects so meshes can share a NATS.",
                            shared=True)
    tls_cert: str = option("", "PEM certificate of this process for mutual TLS on every gRPC hop and on NATS "
                           "(with --tls-key and --tls-ca; empty: plaintext, for loopback). See docs/tls.md.",
                           shared=True, metavar="FILE")
    tls_key: str = option("", "PEM private key of --tls-cert (keep it 0600).", shared=True, metavar="FILE")
    tls_ca: str = option("", "PEM CA certificate that signs every mesh certificate: peers must present one.",
                         shared=True, metavar="FILE")

    def tls(self) -> TlsFiles:
        """The TLS files (all empty: plaintext)."""
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca)


@dataclass(frozen=True)
class CommonSettings(ProcessSettings):
    """What every service has on top: its Prometheus endpoint."""

    metrics_port: int = option(
        0, "Port of this service's Prometheus /metrics HTTP endpoint (0: none; the gateway also serves /metrics "
        "on its HTTP port). harnessmesh up gives each service a free port and prints them.", wiring=True)


@dataclass(frozen=True)
class MeshServiceSettings(CommonSettings):
    """What the services that serve the mesh's streams (parse, router, worker) have on top: how their mux
    sessions batch frames (``services/common/mux.py``)."""

    stream_linger_ms: float = option(
        DEFAULT_LINGER * 1000,
        "Least milliseconds between two messages of plain stream frames to one peer (parse, router and worker "
        "send every stream's frames to a peer on one gRPC stream): what the streams produce meanwhile goes in the "
        "same message. A stream's first frame and its end never wait; an engine stepping slower than this never "
        "waits either. 0: a message whenever the writer is free.", shared=True)

    def validate(self) -> None:
        if not self.stream_linger_ms >= 0:
            raise ValueError("--stream-linger-ms must be >= 0")

    def stream_linger(self) -> float:
        """``stream_linger_ms`` in seconds, as :class:`services.common.mux.MuxServer` takes it."""
        return self.stream_linger_ms / 1000
