"""What ``harnessmesh up`` prints for a person once the mesh is ready: where everything is, what to try next.

The machine-readable twin is the ``mesh.ready`` JSON line (:func:`services.launcher.mesh.ready_line`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

from services.launcher.mesh import Endpoints

TRACING_DOC = "docs/tracing.md"


def traces_line(environ: Mapping[str, str]) -> str:
    """Where the turns' traces go, read from the standard OpenTelemetry variables every process reads too."""
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none" or not endpoint:
        return f"not exported (OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 to send them; {TRACING_DOC})"
    return f"OTLP to {endpoint} (in Jaeger: service harnessmesh-gateway, tag session.id=...; {TRACING_DOC})"


def banner(endpoints: Endpoints, model: str, workers: int, environ: Mapping[str, str]) -> str:
    """The ready banner: endpoints, metrics and trace links, and the next commands to try (copy-paste)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    curl = (f"curl -s {endpoints.http}/v1/chat/completions -H 'content-type: application/json' "
            f"-d {shlex.quote(body)}")
    metrics = [f"  {'metrics:' if i == 0 else '':<10}{name:<10} {url}" for i, (name, url) in
               enumerate(endpoints.metrics.items())]
    rows = [
        f"harnessmesh is up: model {model!r} on {workers} worker{'s' if workers != 1 else ''}",
        f"  HTTP:     {endpoints.http}/v1  (OpenAI Chat Completions and Responses, Anthropic Messages)",
        f"  gRPC:     {endpoints.grpc}  (AgentService)",
        f"  NATS:     {endpoints.nats}",
        f"  workers:  {', '.join(endpoints.workers)}",
        *metrics,
        f"  traces:   {traces_line(environ)}",
        "",
        "Try:",
        f"  {curl}",
        f"  harnessmesh catalog claude-code --url {endpoints.http}   # or codex, pi, openclaw",
        "Ctrl-C stops the mesh.",
    ]
    return "\n".join(rows)
