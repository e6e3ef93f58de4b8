"""Placement: which worker should run a request, given prefix overlaps and load.

``kv`` mode scores each worker (lower is better), in blocks::

    cost = overlap_weight * (prefill ahead + new_blocks) + kv_held ** 2 / capacity
           + live_weight * live * new_blocks / request_blocks

* ``new_blocks``: the blocks of this prompt the worker does not hold (its prefill work; blocks the
  pending-prefix index predicts there count as held, ``pending.py``).
* ``prefill ahead``: the prefill in flight there that this prompt would wait for. A worker that serves the
  prompts with the fewest tokens left first (``--prefill-order shortest``, the mocker's and torch engine's
  default; its heartbeat says so) makes a prompt wait for each request in flight only up to its own size
  (:meth:`WorkerLoad.prefill_ahead`): an agent's next turn with 50 new blocks is not queued behind another
  session's cold 1,500-block prompt, so that prompt no longer pushes the turn off the worker holding its
  1,000 cached blocks. Other engines (TensorRT-LLM) count all prefill in flight, as Dynamo's router does.
* ``kv_held``: the KV the worker's requests in flight would hold with this one (every prompt block plus
  ``agent_hints.osl`` worth of decode blocks), over its ``capacity``: squared, so load a worker has room
  for weighs little and a nearly full one weighs its whole capacity. (Dynamo adds it linearly: two long
  sessions decoding on a worker, 2,400 blocks, then outweigh 240 blocks of prefill, and their neighbour's
  next turn leaves its cache for an idle worker to recompute 15,000 tokens.)
* ``live``: the worker's live footprint, the prompt blocks of the other sessions whose last turn it served
  in the last few minutes (``footprint.py``), weighed by the share of the prompt the worker would compute:
  a new session's context goes where live contexts leave the most room, so long-lived sessions spread by
  the room they keep rather than by the requests in flight at the moment; a worker that holds the prompt
  pays little of it (the session stays), one that lost half of it to eviction pays half (a crowded worker's
  session may move to room).

Without a capacity (a caller that gives no endpoints) the KV term is linear and no footprint counts.
With ``temperature == 0`` the cheapest worker wins and ties go to the worker with fewer requests
in flight; with ``temperature > 0`` the first worker is drawn from a softmax over the normalised costs
(the rest stay cheapest-first, as fallbacks). The other modes exist so benchmarks compare like with like.

``shared`` blocks (per worker: blocks of this prompt that requests in flight there are computing right now)
leave the worker's prefill in flight: the request waits for them there, but would compute them itself on
any other worker, so counting them as queue in front of it would send requests that share a prefix being
prefilled (siblings launched together) to every other worker, each computing it again. The request is then
never worse off by more than its own new blocks, and the mesh saves the shared prefill. The KV term is not
discounted: each request there still holds its blocks, so a large group of siblings spreads again once its
KV outweighs the prefill it saves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.router.registry import WorkerEndpoint, WorkerLoad

MODES = ("kv", "round-robin", "random", "least-loaded")


# Cost weight of the blocks a worker would have to prefill. Swept on the Mooncake conversation trace
# (8 workers, 16,384 x 64-token blocks, `harnessmesh replay`): weight 1 / 2 / 4 / 8 / 16 gave prefix
# reuse 0.204 / 0.215 / 0.234 / 0.238 / 0.244 and mean TTFT 266 / 256 / 245 / 240 / 236 ms. 8 keeps most of
# the gain while load still counts for something when a hot prefix would pile requests on one worker.
DEFAULT_OVERLAP_WEIGHT = 8.0

# Cost of a block of another session's live context on a worker, for a prompt the worker would compute whole
# (a block of prefill costs 8). kv-cache-tester slice at 12,288 blocks per worker (bench/agent_kv.py's, window
# 600 s), TTFT mean: footprints off 131 ms; unscaled weight 0.5 / 1 / 1.5 / 2 / 4: 123 / 122 / 123 / 127 / 131
# ms; scaled by the share computed (as here) 1 / 2 / 4: 120 / 120 / 123 ms. At a 300 s window, weight 1 / 2 on
# two slices (seeds 0, 1) at 16,384 / 12,288 / 11,264 / 10,240 blocks: 91.3, 97.5 / 117.6, 135.4 / 135.0, 148.3 /
# 160.4, 171.1 ms against 89.9, 98.1 / 117.6, 137.9 / 139.4, 151.3 / 158.7, 174.6 ms (TTFT p99 at 11,264: 1,940,
# 2,190 against 2,011, 2,305 ms; 1.5 is no better).
DEFAULT_LIVE_WEIGHT = 1.0

@dataclass(frozen=True)
class Candidate:
    """One worker's standing for one request."""

    worker_id: str
    overlap_blocks: int
    new_blocks: int
    cost: float
    predicted_blocks: int = 0   # of ``overlap_blocks``, those only the pending-prefix index knows


class PlacementPolicy:
    """Orders candidate workers best-first for one request (the rest are retry/migration fallbacks)."""

    def __init__(
        self, mode: str, overlap_weight: float, rng: random.Random | None = None, temperature: float = 0.0,
        live_weight: float = DEFAULT_LIVE_WEIGHT,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown routing mode {mode!r}; valid modes: {', '.join(MODES)}")
        self.mode = mode
        self.overlap_weight = overlap_weight
        self.temperature = temperature
        self.live_weight = live_weight
        self._rng = rng or random.Random()
        self._next = 0

    def rank(
        self,
        request_blocks: int,
        overlaps: Mapping[str, int],
        loads: Mapping[str, WorkerLoad],
        decode_blocks: int = 0,
        predicted: Mapping[str, int] | None = None,
        shared: Mapping[str, int] | None = None,
        endpoints: Mapping[str, WorkerEndpoint] | None = None,
        live: Mapping[str, int] | None = None,
    ) -> list[Candidate]:
        """``predicted`` / ``shared``: per worker, overlap blocks only predicted, and overlap blocks being
        computed there by requests in flight; ``endpoints``: each worker's capacity and prefill order;
        ``live``: each worker's live footprint (see the module docstring); absent means 0 / unknown."""
        candidates = []
        for wid in sorted(overlaps):
            overlap = overlaps[wid]
            new = max(request_blocks - overlap, 0)
            load = loads[wid]
            endpoint = endpoints.get(wid) if endpoints else None
            ahead = load.prefill_ahead(new) if endpoint is not None and endpoint.shortest_prefill_first \
                else load.prefill_blocks
            if shared:
                ahead -= min(shared.get(wid, 0), ahead)
            held = load.active_blocks + request_blocks + decode_blocks
            kv = held * held / endpoint.total_blocks if endpoint is not None and endpoint.total_blocks > 0 else held
            cost = self.overlap_weight * (ahead + new) + kv
            if live and request_blocks:
                cost += self.live_weight * live.get(wid, 0) * new / request_blocks
            candidates.append(Candidate(wid, overlap, new, cost, predicted.get(wid, 0) if predicted else 0))
        if not candidates:
            return []
        if self.mode == "kv":
            ranked = sorted(candidates, key=lambda c: (c.cost, loads[c.worker_id].requests, c.worker_id))
            if self.temperature > 0 and len(ranked) > 1:
                first = self._sample(ranked)
                ranked.remove(first)
                ranked.insert(0, first)
            return ranked
        if self.mode == "least-loaded":
            return sorted(candidates, key=lambda c: (loads[c.worker_id].requests, loads[c.worker_id].active_blocks,
                                                     c.worker_id))
        if self.mode == "round-robin":
            start = self._next % len(candidates)
            self._next += 1
            return candidates[start:] + candidates[:start]
        shuffled = list(candidates)
        self._rng.shuffle(shuffled)
        return shuffled

    def _sample(self, ranked: list[Candidate]) -> Candidate:
        """Softmax over costs normalised to [0, 1]: lower cost, higher probability."""
        low, high = ranked[0].cost, ranked[-1].cost
        span = (high - low) or 1.0
        weights = [math.exp(-(c.cost - low) / span / self.temperature) for c in ranked]
        return self._rng.choices(ranked, weights=weights, k=1)[0]


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def describe(candidates: Sequence[Candidate]) -> list[dict[str, object]]:
    """Candidates as log/span-friendly dicts."""
    return [
        {"worker": c.worker_id, "overlap_blocks": c.overlap_blocks, "predicted_blocks": c.predicted_blocks,
         "new_blocks": c.new_blocks, "cost": c.cost}
        for c in candidates
    ]
