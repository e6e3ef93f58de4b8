"""Codex's local compaction, served from the conversation's cached prefix.

A Codex provider not named OpenAI (what ``harnessmesh catalog codex`` configures) compacts locally: it sends
an ordinary ``/v1/responses`` request, the conversation plus its own summarization prompt as a last user
message, marked ``request_kind: "compaction"`` in the ``x-codex-turn-metadata`` header, but with
``tools: []``. The tools render at the top of the prompt, so dropping them changes its first block and the
engine's prefix cache serves none of it (0 of 3.7k tokens in the harness test). This gateway renders such a
request with the tools the same conversation's last request carried (:class:`SessionTools`), which makes it
the previous turn plus one message (97 % cached). The answer is served as any turn's; Codex takes its text as
the summary. Only Codex requests carry the header; others are untouched. The memo is this process's: on
another replica the request is served as sent (uncached, correct).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

CODEX_METADATA = "x-codex-turn-metadata"


def is_codex_compaction(headers: Mapping[str, str]) -> bool:
    """Whether Codex marked this request a compaction (``request_kind`` in ``x-codex-turn-metadata``)."""
    text = headers.get(CODEX_METADATA)
    if not text or "compaction" not in text:
        return False
    try:
        metadata = json.loads(text)
    except ValueError:
        return False
    return isinstance(metadata, dict) and metadata.get("request_kind") == "compaction"


class SessionTools:
    """The ``tools`` of each Codex conversation's last request (key: ``prompt_cache_key``, else the
    ``session-id`` header), at most ``max_entries`` conversations (least recently used dropped)."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._tools: OrderedDict[str, list[Any]] = OrderedDict()

    def tools_for(self, body_tools: list[Any] | None, cache_key: str | None,
                  headers: Mapping[str, str]) -> list[Any] | None:
        """The tools to render a request with: a Codex local compaction without tools gets its conversation's
        last tools; None (the body's own) otherwise. A Codex request with tools is remembered."""
        if CODEX_METADATA not in headers:
            return None
        key = cache_key or headers.get("session-id") or ""
        if not key:
            return None
        if body_tools:
            self._tools[key] = body_tools
            self._tools.move_to_end(key)
            while len(self._tools) > self.max_entries:
                self._tools.popitem(last=False)
            return None
        if not is_codex_compaction(headers):
            return None
        return self._tools.get(key)
