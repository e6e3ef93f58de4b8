"""``tojson`` results of template data kept across renders: a session's tool definitions.

A harness sends the same tools every turn (Claude Code: 12-21 tools, 32-62 KB of JSON Schema), and a
template writes each one with ``tool | tojson`` on every render: ~0.4 ms of a 21-tool render spent
re-encoding what the last turn encoded. :class:`~services.parse.conversation.ToolDicts` keeps each tool list's
template dicts between turns and registers them here; the renderer's ``tojson`` filter answers a registered
object from here (per filter arguments), computing it once. Objects are matched by identity while
registered (the registry keeps them alive, so an id names no other object), and never change (the
immutable sandbox); anything else is encoded as usual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class JsonMemo:
    """Registered objects and their encodings by filter arguments (thread-safe)."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, dict[tuple[Any, ...], str]]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def register(self, obj: Any) -> None:
        with self._lock:
            self._kept.setdefault(id(obj), (obj, {}))

    def forget(self, obj: Any) -> None:
        with self._lock:
            item = self._kept.get(id(obj))
            if item is not None and item[0] is obj:
                del self._kept[id(obj)]

    def encoded(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], encode: Callable[[], str]) -> str:
        """``encode()``, remembered under the filter's ``args`` / ``kwargs`` when ``obj`` is registered (and they
        are hashable: a ``separators`` list is not)."""
        item = self._kept.get(id(obj))
        if item is None or item[0] is not obj:
            return encode()
        key = (args, tuple(sorted(kwargs.items())))
        try:
            done = item[1].get(key)
        except TypeError:
            return encode()
        if done is None:
            done = item[1][key] = encode()
        return done


MEMO = JsonMemo()  # the process's: tool dicts register here, every compiled template's tojson reads it
