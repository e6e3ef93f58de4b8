"""A request's block table in the block manager (``block_manager.py``): the blocks it holds, its private partial
block, and the chained hashes of its token stream."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.block_hash import seed_for


@dataclass(slots=True)
class PartialBlock:
    """A sequence's private, not yet full block."""

    block_id: int


class KvSequence:
    """One request's block table: how many tokens' KV it holds, its full blocks and partial block.

    A sequence belongs to one token stream that only grows (a request's prompt, then its generated
    tokens; a recompute after preemption feeds the same tokens again): every ``token_ids`` given to
    :meth:`BlockManager.acquire_prefix` / :meth:`BlockManager.append` continues or repeats that stream.
    ``known`` caches the stream's chained block hashes (``hashes`` is always a prefix of it); it survives
    :meth:`BlockManager.free`, and a caller that hashed the prompt already (the router's placement in the
    simulator) passes them in as ``known`` so nothing is hashed twice. Of the tokens themselves only the
    ``tail`` past the last full block is kept (a block whose hash is not known yet is hashed from it).
    """

    def __init__(self, salt: str = "", known: list[int] | None = None) -> None:
        self.salt = salt
        self.seed = seed_for(salt)
        self.length = 0                   # tokens whose KV it holds
        self.tail: list[int] = []         # the last ``length - len(hashes) * block_size`` of them
        self.hashes: list[int] = []       # sequence hashes of the full blocks it references
        self.partial: PartialBlock | None = None
        self.known: list[int] = known if known is not None else []  # hashes of the stream's full blocks

    @property
    def num_blocks(self) -> int:
        return len(self.hashes) + (1 if self.partial is not None else 0)
