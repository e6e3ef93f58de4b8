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

A large request converts in a worker thread (``JsonBody.run``), so two may meet here: a lock covers the
lookup and the update of the kept conversations, never a conversion.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from services.api import chat_pb2
from services.common.sequences import common_prefix

MIN_BYTES = 16 * 1024
Unit = TypeVar("Unit")


class ConvertedMessages(Generic[Unit]):
    """Recent conversations' message keys and their conversions (one gateway; safe across threads).

    ``size`` gives a converted message's size in bytes (for ``MIN_BYTES``).
    """

    def __init__(self, size: Callable[[Unit], int], max_conversations: int = 32, probes: int = 8) -> None:
        self._size = size
        self._max = max_conversations
        self._probes = probes  # recent conversations compared, newest first
        self._lines: OrderedDict[int, tuple[list[Any], list[Unit]]] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        self.reused = 0  # messages taken from a kept conversation

    def convert(self, keys: Sequence[Any], convert_one: Callable[[int], Unit],
                resume: Callable[[Sequence[Unit]], None] = lambda reused: None) -> list[Unit]:
        """Message ``i`` converted: the kept conversion of an equal key at ``i`` in the recent conversation
        sharing the most leading keys with ``keys``, else ``convert_one(i)`` (called in order, after
        ``resume`` was given the conversions taken, so that it can restore what converting them set up)."""
        keys = list(keys)
        with self._lock:
            best, line = self._longest_kept(keys)
            units = self._lines[line][1][:best] if best else []
        resume(units)
        units.extend(convert_one(i) for i in range(best, len(keys)))
        if best < len(keys) and sum(map(self._size, units)) >= MIN_BYTES:  # (all of it known: nothing new to keep)
            with self._lock:
                kept = self._lines.get(line) if best else None
                if kept is not None and best == len(kept[0]):  # it continues that conversation: keep the longer
                    del self._lines[line]
                self._lines[self._next] = (keys, units)
                self._next += 1
                while len(self._lines) > self._max:
                    self._lines.popitem(last=False)
        return units

    def _longest_kept(self, keys: list[Any]) -> tuple[int, int]:
        """How many leading keys the recent conversation sharing the most with ``keys`` shares, and its line."""
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
        if best:
            self._lines.move_to_end(best_key)
            self.reused += best
        return best, best_key


def message_size(message: chat_pb2.Message) -> int:
    return message.ByteSize()
