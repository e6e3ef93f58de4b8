"""The discrete-event replay: trace arrivals -> the real :class:`Router` -> simulated workers.

Events are arrivals (trace timestamps divided by ``speedup``) and step ends of each worker. On arrival
the router core ranks the workers exactly as the router process does (same index, same policy, same
in-flight load book-keeping) and the request joins the chosen worker's scheduler. A worker's KV events
reach the index at the end of the step that produced them.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
from dataclasses import dataclass, field, replace
from operator import attrgetter

from services.common.model_dir import ModelDir, load_model_dir
from services.kvcore import domain as eng
from services.kvcore.request import CoreRequest
from services.kvcore.timing import DynamoTiming
from services.kvcore.tokens import FillerVocabulary
from services.replay.agent import AgentRetention
from services.replay.metrics import ReplayResult, RequestRecord, summarise
from services.replay.sim_worker import SimWorker, SimWorkerConfig
from services.replay.trace import TracePrompts, TraceRequest
from services.router.footprint import DEFAULT_FOOTPRINT_WINDOW, SessionFootprints
from services.router.index import ClearedEvent, KvEvent, KvIndex, RemovedEvent, StoredEvent
from services.router.pending import DEFAULT_PENDING_TTL, PendingPrefixes
from services.router.policy import DEFAULT_OVERLAP_WEIGHT, PlacementPolicy
from services.router.registry import WorkerEndpoint, WorkerRegistry
from services.router.router import InFlight, Router


@dataclass(frozen=True)
class ReplayConfig:
    """One simulated mesh: N workers behind one router."""

    workers: int = 8
    mode: str = "kv"
    worker: SimWorkerConfig = field(default_factory=SimWorkerConfig)
    timing: DynamoTiming = field(default_factory=DynamoTiming)
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    temperature: float = 0.0
    speedup: float = 1.0
    seed: int = 0
    pending_prefix_ttl: float = DEFAULT_PENDING_TTL  # kv: the router's pending-prefix index (0: off)
    retention: bool = True   # workers honour agent traces' retention hints (agent.py; no hints: plain LRU)
    footprint_window: float = DEFAULT_FOOTPRINT_WINDOW  # kv: the router's session footprints (0: off)


_block_hash = attrgetter("block_hash")


def to_router_events(events: list[eng.KvEvent]) -> list[KvEvent]:
    out: list[KvEvent] = []
    for e in events:
        if isinstance(e, eng.KvStored):
            out.append(StoredEvent(e.event_id, tuple(map(_block_hash, e.blocks)), parent=e.parent_hash, chained=True))
        elif isinstance(e, eng.KvRemoved):
            out.append(RemovedEvent(e.event_id, e.block_hashes))
        else:
            out.append(ClearedEvent(e.event_id))
    return out


class Replay:
    """Runs one trace through one simulated mesh (see module docstring)."""

    def __init__(self, config: ReplayConfig, model: ModelDir | None = None) -> None:
        self.config = config
        model = model or load_model_dir("")
        vocab = FillerVocabulary(model.tokenizer)
        registry = WorkerRegistry(timeout=float("inf"), clock=lambda: 0.0)
        # the router's pending-prefix index on the simulated clock (seconds), as a live kv router runs it
        pending = PendingPrefixes(config.pending_prefix_ttl, clock=lambda: self.now / 1000.0) \
            if config.mode == "kv" and config.pending_prefix_ttl > 0 else None
        # The walk, not chain depths: a replay stores far more blocks than it places requests, and keeping
        # depths costs more per stored block than it saves per match (long trace: 1.89 -> 2.24 s; same output).
        footprints = SessionFootprints(config.footprint_window, clock=self._seconds) \
            if config.mode == "kv" and config.footprint_window > 0 else None
        self.router = Router(KvIndex(chains=False), registry,
                             PlacementPolicy(config.mode, config.overlap_weight, random.Random(config.seed),
                                             temperature=config.temperature), pending=pending, footprints=footprints)
        self.workers: dict[str, SimWorker] = {}
        wc = config.worker
        for i in range(config.workers):
            wid = f"sim-{i}"
            registry.heartbeat(WorkerEndpoint(wid, f"sim:{i}", wc.block_size, wc.num_blocks, engine="sim",
                                              shortest_prefill_first=wc.prefill_order == "shortest"))
            self.workers[wid] = SimWorker(wid, replace(wc, retention=config.retention), config.timing, model, vocab,
                                          self._on_events, clock=self._seconds)
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._records: dict[str, RequestRecord] = {}
        self._inflight: dict[str, InFlight] = {}
        self._running: dict[str, CoreRequest] = {}
        self._prompts = TracePrompts(wc.block_size)
        self._arrivals: list[float] = []  # every arrival time, in order; ``_arrived`` of them have happened
        self._arrived = 0
        self.now = 0.0
        self.agents = AgentRetention()
        self._agent_requests: dict[str, TraceRequest] = {}  # requests of agent traces in flight

    def _seconds(self) -> float:
        return self.now / 1000.0

    @property
    def records(self) -> list[RequestRecord]:
        """Every request of the last :meth:`run`, in arrival order."""
        return list(self._records.values())

    def _on_events(self, worker_id: str, events: list[eng.KvEvent]) -> None:
        # only kv placement reads the index (the simulator never asks for ``prefer``): in the other modes
        # keeping it current is a sixth of the run and changes no decision
        if self.config.mode == "kv":
            self.router.on_kv_events(worker_id, to_router_events(events))

    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self, trace: list[TraceRequest]) -> ReplayResult:
        if not trace:
            return summarise([], 0.0)
        # The run allocates a few objects per simulated token and builds no reference cycles, while it
        # holds every live request's token lists: the cyclic collector's passes over them cost ~15% of
        # the run and free nothing, so it is off until the run ends.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(trace)
        finally:
            if collecting:
                gc.enable()

    def _run(self, trace: list[TraceRequest]) -> ReplayResult:
        t0 = trace[0].timestamp_ms
        self._arrivals = [(req.timestamp_ms - t0) / self.config.speedup for req in trace]
        for i, req in enumerate(trace):
            self._push(self._arrivals[i], "arrive", (f"r{i}", req))
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            self.now = at
            if kind == "arrive":
                assert isinstance(payload, tuple)
                rid, treq = payload
                self._arrive(str(rid), treq)
            else:
                self._step_done(str(payload))
        return summarise(list(self._records.values()), self.now)

    def _arrive(self, rid: str, treq: object) -> None:
        assert isinstance(treq, TraceRequest)
        self._arrived += 1
        # synthesised and hashed once (per trace block, shared by the requests repeating it): the router's
        # placement and the chosen worker's engine core share the hashes
        tokens, hashes = self._prompts.prompt(treq)
        placement = self.router.place(tokens, hashes={self.config.worker.block_size: hashes}, session=treq.session)
        best = placement.candidates[0]
        worker = self.workers[best.worker_id]
        max_tokens = max(treq.output_length, 1)
        self._records[rid] = RequestRecord(rid, self.now, len(tokens), max_tokens, best.worker_id)
        self._inflight[rid] = self.router.begin(best.worker_id, placement, best)
        self._running[rid] = core_req = worker.add(rid, tokens, max_tokens, hashes)
        if treq.session:
            self.agents.arrived(treq, self.now / 1000.0)
            self._agent_requests[rid] = treq
            core_req.retention = self.agents.hint(treq)
        if worker.plan is None:
            self._start(worker)

    def _start(self, worker: SimWorker) -> None:
        # Until the next arrival (sorted before steps ending at the same time: pushed first) the worker's quiet
        # steps change nothing another event could see, and run as one.
        horizon = self._arrivals[self._arrived] if self._arrived < len(self._arrivals) else math.inf
        end = worker.start_step(self.now, horizon)
        self._finish(worker.finished_early)
        worker.finished_early.clear()
        if end is not None:
            self._push(end, "step", worker.worker_id)

    def _step_done(self, worker_id: str) -> None:
        worker = self.workers[worker_id]
        first, done = worker.finish_step()
        for req in first:
            record = self._records[req.request_id]
            record.first_token_ms = self.now
            record.cached_tokens = req.cached_tokens or 0
            self._inflight[req.request_id].prefill_done()
        self._finish(done)
        self._start(worker)

    def _finish(self, done: list[CoreRequest]) -> None:
        for req in done:
            record = self._records[req.request_id]
            record.finish_ms = self.now
            record.output_tokens = req.generated
            record.cached_tokens = req.cached_tokens or 0
            self._inflight.pop(req.request_id).release()
            self._running.pop(req.request_id, None)
            treq = self._agent_requests.pop(req.request_id, None)
            if treq is not None:
                self.agents.finished(treq, self.now / 1000.0)


def replay(trace: list[TraceRequest], config: ReplayConfig, model: ModelDir | None = None) -> ReplayResult:
    """Simulate ``trace`` on the mesh ``config`` describes."""
    return Replay(config, model).run(trace)
