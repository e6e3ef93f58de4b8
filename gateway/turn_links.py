"""Where a trajectory's turn links live besides this replica's memory (``--turn-links-store``, docs/state.md).

The turn tracker (``turn_tracking.py``) keeps, per trajectory, the root span of its last turn (the next
turn links to it) and the tool calls it dispatched that no later turn has answered yet (a tool result
becomes an ``execute_tool {tool}`` span from our dispatch to its arrival). With one gateway its memory
holds them; with several replicas behind a load balancer the next turn may land anywhere, so
:class:`JetStreamTurnLinks` keeps them in a KV bucket keyed by ``session/trajectory``. Per turn, never
per token:

- one read (:meth:`JetStreamTurnLinks.load`) started when the turn begins and awaited once the parse call
  is under way, so it overlaps the prompt's render and routing;
- one write (:meth:`JetStreamTurnLinks.save`) when the turn ends: before its last frame reaches the client
  (the next turn, on any replica, finds it), or after the stream ended without a finish.

The links are advisory, like the prefix watch: NATS down or slow costs at most ``timeout`` per read or
write (nothing while the connection is known to be down) and a ``gateway.turn_links_unavailable``
warning, never a failed request. Two turns of one trajectory running at once on two replicas: the last
one to finish wins. Anonymous turns (no session id: a fresh one per request) have no key to share under
and stay in the replica's memory.

Value layout (JSON): ``{"turn": [trace_id, span_id, flags] | null, "calls": [[call_id, name, dispatched_at_ns,
trace_id, span_id, flags, harness], ...]}``, ids in hex.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from opentelemetry import trace

from services.common.jetstream import ChunkedKv

log = structlog.get_logger()

MAX_CALLS = 256  # unanswered dispatched calls kept per trajectory (the newest)


@dataclass(frozen=True)
class Dispatched:
    """A tool call the gateway dispatched: its name, when (wall clock), the turn that did and its harness."""

    name: str
    at_ns: int
    turn: trace.SpanContext  # the root span of the turn that dispatched it
    harness: str


@dataclass
class TrajectoryLinks:
    """What a trajectory's next turn needs: its last turn's span and its unanswered dispatched calls."""

    turn: trace.SpanContext | None = None
    calls: dict[str, Dispatched] = field(default_factory=dict)


def _context(parts: list[Any]) -> trace.SpanContext:
    return trace.SpanContext(int(parts[0], 16), int(parts[1], 16), is_remote=True,
                             trace_flags=trace.TraceFlags(int(parts[2])))


def _parts(ctx: trace.SpanContext) -> list[Any]:
    return [format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), int(ctx.trace_flags)]


def encode(links: TrajectoryLinks, max_calls: int = MAX_CALLS) -> bytes:
    """``links`` as the bucket stores them (the newest ``max_calls`` calls)."""
    calls = list(links.calls.items())[-max_calls:] if max_calls > 0 else []
    return orjson.dumps({
        "turn": _parts(links.turn) if links.turn is not None else None,
        "calls": [[call_id, d.name, d.at_ns, *_parts(d.turn), d.harness] for call_id, d in calls],
    })


def decode(data: bytes) -> TrajectoryLinks:
    """The links :func:`encode` wrote."""
    raw = orjson.loads(data)
    turn = _context(raw["turn"]) if raw.get("turn") else None
    calls = {c[0]: Dispatched(c[1], int(c[2]), _context(c[3:6]), c[6]) for c in raw.get("calls", [])}
    return TrajectoryLinks(turn, calls)


class JetStreamTurnLinks:
    """Turn links in a JetStream KV bucket (``kv``), keyed by ``session/trajectory``; see the module docstring."""

    def __init__(self, kv: ChunkedKv, *, timeout: float = 1.0, connected: Callable[[], bool] = lambda: True,
                 max_calls: int = MAX_CALLS) -> None:
        self._kv = kv
        self._timeout = timeout
        self._connected = connected
        self.max_calls = max_calls

    async def load(self, key: str) -> TrajectoryLinks:
        """The trajectory's links; empty when there are none, or NATS did not answer in time."""
        if not self._connected():
            return TrajectoryLinks()
        try:
            blob = await asyncio.wait_for(self._kv.get(key), self._timeout)
            return TrajectoryLinks() if blob is None or blob.value is None else decode(blob.value)
        except Exception as exc:
            log.warning("gateway.turn_links_unavailable", op="load", error=f"{type(exc).__name__}: {exc}")
            return TrajectoryLinks()

    async def save(self, key: str, links: TrajectoryLinks) -> None:
        """Store the trajectory's links (a failure is a warning: the next turn just lacks them)."""
        if not self._connected():
            return
        try:
            await asyncio.wait_for(self._kv.put(key, encode(links, self.max_calls)), self._timeout)
        except Exception as exc:
            log.warning("gateway.turn_links_unavailable", op="save", error=f"{type(exc).__name__}: {exc}")
