"""An LRU map bounded by the total size of its values (what the prompt and message reuse stores keep)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class SizedLru(Generic[T]):
    """Values by key, each with its size; the least recently used go first beyond ``max_bytes`` in all
    (a value larger than that alone is not kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[str, tuple[T, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> T | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, value: T, size: int) -> None:
        self.pop(key)
        if size > self.max_bytes:
            return
        self._items[key] = (value, size)
        self.size += size
        while self.size > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.size -= old

    def pop(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.size -= item[1]
