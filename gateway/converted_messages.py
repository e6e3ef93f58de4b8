"""Converted messages of recent conversations, found again by the raw JSON of the next turn.

An agent's next request repeats the previous one's messages and adds a few. Converting a message (the
API's validated model to canonical ``chat_pb2.Message`` values) depends on that message and on the
messages before it, so a message whose key is equal to the one at the same place in a recent request,
after equal keys all the way from the first, converts to what that one did: the gateway takes that, and
converts only the messages after the first that differs. A key is the raw message as ``orjson`` made it
(dicts of str, numbers, lists: a C-speed equality), with whatever else its conversion reads from the
request (the Messages API's "keeps its thinking" flag). ~0.3 ms of conversion is saved per 100k-token
chat turn for ~0.03 ms of comparing, ~0.7 ms per Messages API turn. Only conversations of at least
``MIN_BYTES`` of converted messages are kept, at most ``max_conversations`` of them, least recently used
dropped first.

The API's converter owns what a converted message is (``Unit``): the chat API's is one message, the
Messages API's the several a user message with tool results becomes, with the tool calls it names, the
Responses API's a run of input items (those merged into one assistant turn stay in one run).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.api import chat_pb2
from services.common.sequences import common_prefix

MIN_BYTES = 16 * 1024
Unit = TypeVar("Unit")


@dataclass(frozen=True)
class Reused(Generic[Unit]):
    """The converted leading messages a request shares with a kept conversation (``conversation`` -1: none)."""

    units: list[Unit]
    conversation: int


class ConvertedMessages(Generic[Unit]):
    """Recent conversations' message keys and their conversions (one gateway, one event loop).

    ``size`` gives a converted message's size in bytes (for ``MIN_BYTES``).
    """

    def __init__(self, size: Callable[[Unit], int], max_conversations: int = 32, probes: int = 8) -> None:
        self._size = size
        self._max = max_conversations
        self._probes = probes  # recent conversations compared, newest first
        self._lines: OrderedDict[int, tuple[list[Any], list[Unit]]] = OrderedDict()
        self._next = 0
        self.reused = 0  # messages taken from a kept conversation

    def reuse(self, keys: list[Any]) -> Reused[Unit]:
        """The conversions of the most leading ``keys`` a recent conversation shares with this request."""
        best, best_key = 0, -1
        if keys:
            for key in list(reversed(self._lines))[: self._probes]:
                kept = self._lines[key][0]
                limit = min(len(kept), len(keys))
                if limit <= best or kept[0] != keys[0]:
                    continue
                n = common_prefix(kept, keys)
                if n > best:
                    best, best_key = n, key
        if not best:
            return Reused([], -1)
        self._lines.move_to_end(best_key)
        self.reused += best
        return Reused(self._lines[best_key][1][:best], best_key)

    def keep(self, keys: list[Any], units: list[Unit], reused: Reused[Unit]) -> None:
        """Remember this request's conversions (``units``, one per key), found by :meth:`reuse` with ``reused``."""
        best = len(reused.units)
        if best == len(keys) or sum(map(self._size, units)) < MIN_BYTES:  # nothing new to keep, or too small
            return
        kept = self._lines.get(reused.conversation)
        if best and kept is not None and best == len(kept[0]):  # it continues that conversation: keep the longer
            del self._lines[reused.conversation]
        self._lines[self._next] = (keys, units)
        self._next += 1
        while len(self._lines) > self._max:
            self._lines.popitem(last=False)

    def convert(self, keys: Sequence[Any], convert_one: Callable[[int], Unit]) -> list[Unit]:
        """Message ``i`` converted: the kept conversion of an equal key at ``i`` in the recent conversation
        sharing the most leading keys with ``keys``, else ``convert_one(i)`` (called in order)."""
        keys = list(keys)
        reused = self.reuse(keys)
        units = list(reused.units)
        units.extend(convert_one(i) for i in range(len(units), len(keys)))
        self.keep(keys, units, reused)
        return units


def message_size(message: chat_pb2.Message) -> int:
    return message.ByteSize()
