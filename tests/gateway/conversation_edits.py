"""Random edits of a few agent conversations, as the conversion memos' tests replay them."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

Conversation = list[dict[str, Any]]


def edited_conversations(
    rng: random.Random, opening: Callable[[], Conversation], grow: Callable[[Conversation, int], None], *,
    steps: int = 150, cut_at: Callable[[Conversation, int], int] = lambda conversation, at: at,
) -> Iterator[tuple[Conversation, float]]:
    """``steps`` times one of three conversations (``opening`` each, grown by 5 turns) and the draw that edited
    it: below 0.6 it got its next turn or two (``grow``), below 0.8 its history was rewritten from a point
    (``cut_at`` may move that point) and grown again, otherwise it is as it was (the caller may edit elsewhere)."""
    sessions = []
    for _ in range(3):
        conversation = opening()
        grow(conversation, 5)
        sessions.append(conversation)
    for _ in range(steps):
        conversation = rng.choice(sessions)
        edit = rng.random()
        if edit < 0.6:  # the next turn
            grow(conversation, rng.randrange(1, 3))
        elif edit < 0.8 and len(conversation) > 3:  # history rewritten from some point (compaction)
            del conversation[cut_at(conversation, rng.randrange(1, len(conversation) - 1)):]
            grow(conversation, rng.randrange(1, 3))
        yield conversation, edit
