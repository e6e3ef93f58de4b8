"""The router's domain core: the KV index, the live workers, and placement decisions.

Shared by the router process and the trace-replay simulator (``services/replay``): neither gRPC nor
NATS is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.common import token_bytes
from services.common.block_hash import PrefixHashCache
from services.router.footprint import SessionFootprints
from services.router.index import KvEvent, KvIndex
from services.router.pending import PendingEntry, PendingPrefixes
from services.router.policy import Candidate, PlacementPolicy, blocks_for
from services.router.registry import WorkerEndpoint, WorkerLoad, WorkerRegistry


@dataclass(frozen=True)
class Placement:
    """Workers ranked best-first for one request."""

    candidates: list[Candidate]
    request_blocks: int
    decode_blocks: int = 0
    hashes: Mapping[int, Sequence[int]] = field(default_factory=dict)  # the prompt's block hashes per block size
    cached: Mapping[str, int] = field(default_factory=dict)            # per worker: overlap the KV index shows
    session: str = ""                                                   # whose turn it is (footprints)


@dataclass(frozen=True)
class Saturation:
    """When a worker counts as saturated (both limits off: never, so nothing ever queues)."""

    max_requests: int = 0          # requests this router has in flight on the worker (0: no limit)
    kv_fraction: float = 0.0       # share of its KV blocks those requests occupy (0: no limit)

    @property
    def enabled(self) -> bool:
        return self.max_requests > 0 or self.kv_fraction > 0


class InFlight:
    """One request's share of a worker's load while it runs there (release it exactly once)."""

    def __init__(self, load: WorkerLoad, blocks: int, prefill_blocks: int,
                 pending: tuple[PendingPrefixes, PendingEntry] | None = None) -> None:
        """``pending``: the request's entry in the pending-prefix index (ended with the prefill or the request)."""
        self._load = load
        self._blocks = blocks
        self._prefill = prefill_blocks
        self._pending = pending
        load.requests += 1
        load.active_blocks += blocks
        load.add_prefill(prefill_blocks)
        self._done = False

    def prefill_done(self) -> None:
        """The worker sent its first frame: this request no longer adds prefill work."""
        self._load.end_prefill(self._prefill)
        self._prefill = 0
        if self._pending is not None:
            self._pending[0].prefill_done(self._pending[1])

    def release(self) -> None:
        """The request left the worker; before its first frame (failed, cancelled) its predicted blocks go too."""
        if self._done:
            return
        self._done = True
        if self._pending is not None and self._pending[1].prefilling:  # after it, the prediction just expires
            self._pending[0].drop(self._pending[1])
        self._load.requests -= 1
        self._load.active_blocks -= self._blocks
        self._load.end_prefill(self._prefill)
        self._prefill = 0


class Router:
    """Keeps the KV index current and ranks workers for each request."""

    def __init__(
        self, index: KvIndex, registry: WorkerRegistry, policy: PlacementPolicy,
        saturation: Saturation | None = None,
        hash_cache_tokens: int = 1 << 21,
        pending: PendingPrefixes | None = None,
        footprints: SessionFootprints | None = None,
    ) -> None:
        """``hash_cache_tokens``: prompt tokens whose block hashes are kept per block size, so that an agent's
        next turn hashes only its new blocks (:class:`PrefixHashCache`; 4 bytes a token; 0: off).

        ``pending``: the pending-prefix index (``pending.py``): requests placed here count for placement
        before their KV events arrive (None: off).

        ``footprints``: the sessions' live footprints (``footprint.py``), counted by ``kv`` placement (None: off)."""
        self.index = index
        self.pending = pending
        self.footprints = footprints
        self.registry = registry
        self.policy = policy
        self.saturation = saturation or Saturation()
        self._hash_cache_tokens = hash_cache_tokens
        self._hash_caches: dict[int, PrefixHashCache] = {}

    def on_kv_events(self, worker_id: str, events: Sequence[KvEvent]) -> bool:
        """Apply events; True when the worker's stream has a gap to repair."""
        if self.pending is not None:
            self.pending.on_events(worker_id, events)
        return self.index.apply(worker_id, events)

    def on_heartbeat(self, endpoint: WorkerEndpoint) -> bool:
        return self.registry.heartbeat(endpoint)

    def forget(self, worker_id: str) -> WorkerEndpoint | None:
        self._worker_left(worker_id)
        return self.registry.remove(worker_id)

    def expire(self) -> list[WorkerEndpoint]:
        gone = self.registry.expire()
        for ep in gone:
            self._worker_left(ep.worker_id)
        return gone

    def _worker_left(self, worker_id: str) -> None:
        self.index.remove_worker(worker_id)
        if self.pending is not None:
            self.pending.remove_worker(worker_id)
        if self.footprints is not None:
            self.footprints.remove_worker(worker_id)

    def overdue(self, fraction: float = 1.0) -> list[WorkerEndpoint]:
        """Workers whose heartbeat is late (see :meth:`WorkerRegistry.overdue`)."""
        return self.registry.overdue(fraction)

    def place(
        self,
        token_ids: Sequence[int] | bytes,
        cache_salt: str = "",
        exclude: frozenset[str] = frozenset(),
        *,
        osl: int = 0,
        prefer: str = "",
        hashes: Mapping[int, Sequence[int]] | None = None,
        session: str = "",
    ) -> Placement:
        """Rank every live worker for a prompt; ``prefer`` (if live) goes first whatever its cost.

        ``token_ids``: a list of ids, or the packed bytes a ``GenerateRequest`` carries (hashed as they are).

        ``hashes``: the prompt's sequence hashes (with ``cache_salt``) per block size, when the caller has
        them already (the simulator hands the same list to the worker's engine core); other block sizes
        are hashed here.

        ``session``: the session (and trajectory) the request belongs to, for the live footprints ("": none).
        """
        endpoints = [ep for ep in self.registry.endpoints() if ep.worker_id not in exclude]
        if not endpoints:
            return Placement([], 0)
        overlaps: dict[str, int] = {}
        cached: dict[str, int] = {}
        predicted: dict[str, int] = {}
        shared: dict[str, int] = {}
        prompt_hashes: dict[int, Sequence[int]] = {}
        request_blocks = decode_blocks = 0
        count = token_bytes.count(token_ids) if isinstance(token_ids, bytes) else len(token_ids)
        pending = self.pending
        if pending is not None:
            pending.expire()
        for block_size in sorted({ep.block_size for ep in endpoints}):
            group = [ep.worker_id for ep in endpoints if ep.block_size == block_size]
            if self.policy.mode == "kv" or prefer:
                known = hashes.get(block_size) if hashes is not None else None
                if known is None:
                    known = self._hash_cache(block_size).hashes(token_ids, cache_salt)
                prompt_hashes[block_size] = known
                found = self.index.overlaps(known, group)
                cached.update(found)
                overlaps.update(found)
                if pending is not None:
                    for wid in group:
                        match = pending.match(wid, known, found[wid], self.index.holds(wid))
                        if match.predicted or match.shared:
                            overlaps[wid] += match.predicted
                            predicted[wid], shared[wid] = match.predicted, match.shared
            else:
                overlaps.update(dict.fromkeys(group, 0))
            request_blocks = max(request_blocks, blocks_for(count, block_size))
            decode_blocks = max(decode_blocks, blocks_for(max(osl, 0), block_size))
        loads = {wid: self.registry.load(wid) for wid in overlaps}
        live = self.footprints.live(session) if self.footprints is not None and self.policy.mode == "kv" else None
        ranked = self.policy.rank(request_blocks, overlaps, loads, decode_blocks, predicted, shared,
                                  {ep.worker_id: ep for ep in endpoints}, live)
        if prefer:
            ranked.sort(key=lambda c: c.worker_id != prefer)
        return Placement(ranked, request_blocks, decode_blocks, prompt_hashes, cached, session)

    def _hash_cache(self, block_size: int) -> PrefixHashCache:
        cache = self._hash_caches.get(block_size)
        if cache is None:
            cache = self._hash_caches[block_size] = PrefixHashCache(
                block_size, self._hash_cache_tokens)
        return cache

    def begin(self, worker_id: str, placement: Placement, candidate: Candidate) -> InFlight:
        """Count a request against a worker's load while it runs there (and, with the pending-prefix index,
        its prompt blocks as soon to be held there)."""
        entry = None
        endpoint = self.registry.get(worker_id)
        if self.pending is not None and endpoint is not None and self.policy.mode == "kv":
            known = placement.hashes.get(endpoint.block_size)
            if known:
                entry = (self.pending, self.pending.add(worker_id, known, placement.cached.get(worker_id, 0),
                                                        candidate.overlap_blocks))
        if self.footprints is not None and placement.session:
            self.footprints.record(placement.session, worker_id, placement.request_blocks)
        return InFlight(self.registry.load(worker_id), placement.request_blocks + placement.decode_blocks,
                        candidate.new_blocks, entry)

    def saturated(self, worker_id: str) -> bool:
        sat = self.saturation
        load = self.registry.load(worker_id)
        if sat.max_requests > 0 and load.requests >= sat.max_requests:
            return True
        endpoint = self.registry.get(worker_id)
        return (sat.kv_fraction > 0 and endpoint is not None
                and load.active_blocks >= sat.kv_fraction * endpoint.total_blocks)

    def all_saturated(self) -> bool:
        """True when queueing applies and every live worker is saturated (no workers: not saturated)."""
        if not self.saturation.enabled:
            return False
        endpoints = self.registry.endpoints()
        return bool(endpoints) and all(self.saturated(ep.worker_id) for ep in endpoints)
