"""The KV retention a chat turn asks of its worker (agent-aware retention, docs/agent-kv.md).

A turn of a conversation that declares tools may end in a tool call; the harness then runs the tool and sends
the next turn, the same prompt plus the call and its result, within its tool time. The worker holds the
turn's KV blocks for the harness's tool wait (learnt per harness from the waits this service saw:
``services/common/tool_wait.py``, ``TOOL_WAIT_S`` until enough were seen) if (and only if) the output holds
the model's tool-call marker; a turn that ends with an answer gets no hold. A sub-agent's turn (its identity
names a parent) that ends with an answer ends the sub-agent: its blocks go first. A request the client marked
as its session's last (``hints.session_final``) has its blocks go first whatever its end. What the client
marked for caching (``hints.cache_ttl_s``, from Anthropic ``cache_control``) the worker reads from the hints.
"""

from __future__ import annotations

from services.api import chat_pb2, worker_pb2
from services.common.tool_wait import ToolWaitRule

# Seconds a tool-call turn's blocks are held until the harness's waits are learnt: Claude Code's tool waits on
# kv-cache-tester's traces are ~11 s at the median and ~95 s at p90 (bench/agent_trace.py slices); the hold is
# soft (evicted last, never refused).
TOOL_WAIT_S = 60.0
TOOL_WAIT_RULE = ToolWaitRule(default_s=TOOL_WAIT_S)


def is_sub_agent(request: chat_pb2.ChatRequest) -> bool:
    """Whether ``request`` is a sub-agent's (its identity names a parent trajectory or session)."""
    ident = request.identity
    return bool(ident.parent_trajectory_id or ident.parent_session_id)


def kv_retention(request: chat_pb2.ChatRequest, tool_wait_s: float = TOOL_WAIT_S) -> worker_pb2.KvRetention:
    """The retention for ``request``'s generate call, a tool-call turn being held ``tool_wait_s`` (doubled
    when ``agent_hints.priority`` > 0); empty when it declares no tools, is no sub-agent's and is not final."""
    out = worker_pb2.KvRetention()
    if request.hints.session_final:
        out.evict_first = True
        return out
    if request.tools:
        out.tool_call_hold_s = tool_wait_s * (2.0 if request.hints.priority > 0 else 1.0)
    if is_sub_agent(request):
        out.answer_evict_first = True
    return out
