"""The KV retention a chat turn asks of its worker (agent-aware retention, docs/agent-kv.md).

A turn of a conversation that declares tools may end in a tool call; the harness then runs the tool and sends
the next turn, the same prompt plus the call and its result, within its tool time. The worker holds the
turn's KV blocks for ``TOOL_WAIT_S`` if (and only if) the output holds the model's tool-call marker; a turn
that ends with an answer gets no hold. What the client marked for caching (``hints.cache_ttl_s``, from
Anthropic ``cache_control``) the worker reads from the hints itself.
"""

from __future__ import annotations

from services.api import chat_pb2, worker_pb2

# Seconds a tool-call turn's blocks are held: Claude Code's tool waits on kv-cache-tester's traces are ~11 s at
# the median and ~95 s at p90 (bench/agent_trace.py slices); the hold is soft (evicted last, never refused).
TOOL_WAIT_S = 60.0


def kv_retention(request: chat_pb2.ChatRequest) -> worker_pb2.KvRetention:
    """The retention for ``request``'s generate call (empty when it declares no tools)."""
    if not request.tools:
        return worker_pb2.KvRetention()
    hold = TOOL_WAIT_S * (2.0 if request.hints.priority > 0 else 1.0)
    return worker_pb2.KvRetention(tool_call_hold_s=hold)
