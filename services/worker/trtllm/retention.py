"""Agent-aware retention mapped onto TensorRT-LLM's ``KvCacheRetentionConfig`` (docs/agent-kv.md).

TensorRT-LLM evicts by priority (0-100, default 35), each block's priority lasting ``duration_ms`` before it
falls back to the default. A request's hint becomes one token range over its whole prompt, and the same for its
decoded tokens (the next turn's prompt holds them): a plain hold (``cache_control``) at :data:`HOLD_PRIORITY`
for its TTL; a tool-call hold at :data:`TOOL_CALL_PRIORITY` for its TTL; evict-first at
:data:`FIRST_PRIORITY`. TensorRT-LLM takes the config when the request is submitted, before its output is
known, so a tool-call hold applies whatever the turn's end (weaker than the plain one: most turns of a tool
loop end in a call, the others' priority lapses with their TTL). Soft as our own: priorities only order
eviction. A sub-agent's ``answer_evict_first`` is not mapped: it depends on the turn's end, unknown at submission,
and most of a sub-agent's turns end in tool calls (its tool-call hold applies).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from services.kvcore.domain import EngineRequest

HOLD_PRIORITY = 70
TOOL_CALL_PRIORITY = 55
FIRST_PRIORITY = 1


def retention_config(config_class: Callable[..., Any] | None, request: EngineRequest, enabled: bool = True) -> Any:
    """``config_class`` (``tensorrt_llm.llmapi.KvCacheRetentionConfig``) for ``request``'s hint, or None when it
    has none, retention is off, or the install has no such class."""
    if config_class is None or not enabled:
        return None
    if request.retention_first:
        priority, seconds = FIRST_PRIORITY, 0.0
    elif request.retention_hold_s > 0:
        priority, seconds = HOLD_PRIORITY, max(request.retention_hold_s, request.retention_tool_call_hold_s)
    elif request.retention_tool_call_hold_s > 0:
        priority, seconds = TOOL_CALL_PRIORITY, request.retention_tool_call_hold_s
    else:
        return None
    duration = datetime.timedelta(seconds=seconds) if seconds > 0 else None
    token_range = config_class.TokenRangeRetentionConfig(0, None, priority, duration)  # type: ignore[attr-defined]
    return config_class(token_range_retention_configs=[token_range], decode_retention_priority=priority,
                        decode_duration_ms=duration)
