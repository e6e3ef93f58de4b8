"""The Engine contract over the shared engine core: what the mocker and torch engines have in common.

:class:`CoreEngine` owns an :class:`~services.kvcore.core.EngineCore` and its real-clock
:class:`~services.kvcore.loop.StepLoop`, fans KV events out to subscribers and reports info and load.
A subclass supplies only its compute (a :class:`~services.kvcore.loop.StepCompute`) and how it turns a
validated request into a :class:`~services.kvcore.request.CoreRequest`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import structlog

from services.common.errors import InternalError
from services.common.model_dir import ModelDir
from services.kvcore.config import BatchingConfig
from services.kvcore.core import EngineCore
from services.kvcore.loop import StepCompute, StepLoop
from services.kvcore.outputs import CheckedRequest, check_request
from services.kvcore.request import CoreRequest
from services.kvcore.retention import Retention
from services.worker.engine import EngineInfo, EngineOutput, EngineRequest, EngineStats, KvEvent
from services.worker.kv_feed import KvEventFeed

log = structlog.get_logger()


class CoreEngine:
    """Implements :class:`services.worker.engine.Engine` with the shared core; see the module docstring."""

    name = ""

    def __init__(
        self,
        config: BatchingConfig,
        model: ModelDir,
        compute: StepCompute,
        *,
        on_event: Callable[[KvEvent], None] | None = None,
        on_release: Callable[[CoreRequest], None] | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self._feed = KvEventFeed()
        self._on_event = on_event
        self.core = EngineCore(config, on_event=self._emit, on_release=on_release)
        self.blocks = self.core.blocks
        self.loop = StepLoop(self.core, compute, name=self.name, on_failure=self._failed)

    def _new_request(self, checked: CheckedRequest) -> CoreRequest:
        raise NotImplementedError

    # -- Engine contract ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.loop.start()

    async def close(self) -> None:
        await self.loop.close()
        self._feed.close()

    async def abort(self, request_id: str) -> None:
        await self.loop.abort(request_id)

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._feed.subscribe()

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, self.model.name, self.config.block_size, self.config.num_blocks,
                          self.model.max_model_len, self.config.prefill_order == "shortest")

    def stats(self) -> EngineStats:
        s, blocks = self.core.scheduler, self.core.blocks
        return EngineStats(
            active_requests=len(s.running) + len(s.waiting),
            running_requests=len(s.running),
            waiting_requests=len(s.waiting),
            active_blocks=blocks.active_blocks,
            cached_blocks=blocks.cached_blocks,
            total_blocks=blocks.total_blocks,
            block_size=blocks.block_size,
            steps=self.core.steps,
            preemptions=s.preemptions,
            extra=retention_stats(blocks.retention),
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if not self.loop.running:
            raise InternalError("the engine is not running")
        checked = check_request(request, self.model, capacity_tokens=self.config.capacity_tokens,
                                max_tokens_default=self.config.max_tokens_default)
        async with contextlib.aclosing(self.loop.generate(self._new_request(checked))) as outputs:
            async for out in outputs:
                yield out

    def clear_kv_cache(self) -> bool:
        """Drop every cached (unreferenced) block; refused while requests hold blocks."""
        return self.blocks.clear()

    # -- internals ------------------------------------------------------------------------------

    def _emit(self, event: KvEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
        self._feed.emit(event)

    def _failed(self, exc: BaseException) -> None:
        log.exception("worker.engine_failed", engine=self.name, error=str(exc))


def retention_stats(retention: Retention) -> dict[str, float]:
    """The retention figures a worker exports (``kv_retention_*``: metrics, docs/agent-kv.md)."""
    st = retention.stats
    return {"kv_retention_held_blocks": float(retention.held_blocks), "kv_retention_leases": float(st.leases),
            "kv_retention_lease_hits": float(st.hits), "kv_retention_hit_blocks": float(st.hit_blocks),
            "kv_retention_expired_blocks": float(st.expired_blocks),
            "kv_retention_broken_blocks": float(st.broken_blocks),
            "kv_retention_marked_blocks": float(st.marked_blocks)}
