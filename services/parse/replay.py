"""How an assistant turn's reasoning is replayed into the next prompt (the reasoning replay policy).

An assistant turn is stored as ordered parts: reasoning_0, tool_call_0, reasoning_1, ..., text. On the
next turn the reasoning goes back to the template in one of three ways:

- ``pass``: as ``reasoning_content`` (transformers also hands it on as ``thinking`` / ``reasoning``);
  right for every template that reads one of those keys (Qwen3, GLM, MiniMax, Nemotron 3, gpt-oss).
- ``reinsert``: inside the model's own reasoning markers, in place, in ``content`` — for templates that
  never read reasoning but whose model was trained on it inline.
- ``drop``: not at all.

``auto`` picks ``pass`` when the template reads reasoning, else ``drop`` (what the template's authors
intended: such templates strip ``<think>`` from history themselves).

``truncate_history_thinking`` (a chat template kwarg, per request) asks to drop the reasoning of turns
before the last user message. When a reasoning parser is active and the request does not say, it is
set to ``false`` (like Dynamo): agents then replay think -> tool -> think -> tool turns
byte-identically and every turn's prefix is a cache hit. Templates that know the kwarg (Nemotron 3)
apply it themselves; for ``reinsert`` the parse service applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ReplayMode = Literal["pass", "reinsert", "drop"]
REPLAY_CHOICES = ("auto", "pass", "reinsert", "drop")
TRUNCATE_KWARG = "truncate_history_thinking"

_READS_REASONING = re.compile(r"reasoning_content|\.thinking\b|\[['\"]thinking['\"]\]|\.reasoning\b")


def template_reads_reasoning(template: str) -> bool:
    """True when the chat template reads an assistant message's reasoning itself."""
    return _READS_REASONING.search(template) is not None


@dataclass(frozen=True)
class ReplayPolicy:
    """The replay of reasoning for one model: mode, the markers for ``reinsert``, the history default."""

    mode: ReplayMode = "pass"
    open: str = "<think>\n"
    close: str = "\n</think>\n\n"
    keep_history: bool = False

    @classmethod
    def for_template(
        cls, template: str, choice: str = "auto", *, markers: tuple[str, str] | None = None, keep_history: bool = False
    ) -> ReplayPolicy:
        """Resolve ``choice`` (one of REPLAY_CHOICES) against ``template``; ``markers`` are (open, close)."""
        if choice not in REPLAY_CHOICES:
            raise ValueError(f"unknown reasoning replay {choice!r}; valid: {', '.join(REPLAY_CHOICES)}")
        auto: ReplayMode = "pass" if template_reads_reasoning(template) else "drop"
        mode: ReplayMode = auto if choice == "auto" else choice  # type: ignore[assignment]
        open_, close = markers or (cls.open, cls.close)
        return cls(mode=mode, open=open_, close=close, keep_history=keep_history)

    def truncate(self, kwargs: dict[str, object]) -> bool:
        """Whether this request drops the reasoning of earlier turns."""
        value = kwargs.get(TRUNCATE_KWARG)
        return (not self.keep_history) if value is None else bool(value)
