"""Anthropic ``cache_control`` breakpoints -> how long the client wants its prompt cached (agent hints).

Claude Code marks its system prompt, tools and latest messages ``{"type": "ephemeral"}`` (5 minutes) or with
``"ttl": "1h"``. The longest TTL marked anywhere in the body becomes ``hints.cache_ttl_s``, which the worker
turns into a soft lease on the prompt's KV blocks (docs/agent-kv.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

DEFAULT_TTL_S = 300.0
_TTLS = {"5m": 300.0, "1h": 3600.0}


def _marks(body: dict[str, Any]) -> Iterator[Any]:
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            yield from (item.get("cache_control") for item in body[key] if isinstance(item, dict))
    for message in body.get("messages") or ():
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            yield from (b.get("cache_control") for b in message["content"] if isinstance(b, dict))


def cache_ttl_s(body: Any) -> float:
    """The longest ``cache_control`` TTL in a Messages body, in seconds (0: none marked)."""
    if not isinstance(body, dict):
        return 0.0
    ttls = [_TTLS.get(str(mark.get("ttl", "5m")), DEFAULT_TTL_S)
            for mark in _marks(body) if isinstance(mark, dict) and mark.get("type") == "ephemeral"]
    return max(ttls, default=0.0)
