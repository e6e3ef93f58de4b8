"""Replay a trace against a live router (mocker workers) at a time-compression factor.

Arrivals keep the trace's spacing divided by ``speedup``; each request asks for exactly its
``output_length`` tokens (``ignore_eos``). TTFT and TPOT are measured on the client side and scaled back
by ``speedup`` (so run the workers with the same ``--speedup`` to compare with the simulator); prefix
reuse comes from the ``cached_tokens`` each worker reports.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from services.api import common_pb2, router_pb2_grpc, worker_pb2
from services.router.sim.metrics import ReplayResult, RequestRecord, summarise
from services.router.sim.trace import TraceRequest


async def replay_live(trace: list[TraceRequest], router_address: str, speedup: float = 1.0) -> ReplayResult:
    """Send every trace request to ``router_address`` on the trace's (compressed) schedule."""
    records: list[RequestRecord] = []
    async with grpc.aio.insecure_channel(router_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        loop = asyncio.get_running_loop()
        start = loop.time()
        t0 = trace[0].timestamp_ms if trace else 0.0

        def now_ms() -> float:
            return (loop.time() - start) * 1000.0 * speedup

        async def one(i: int, req: TraceRequest) -> None:
            await asyncio.sleep(max(0.0, (req.timestamp_ms - t0) / 1000.0 / speedup - (loop.time() - start)))
            tokens = req.tokens()
            record = RequestRecord(f"r{i}", now_ms(), len(tokens), max(req.output_length, 1), "")
            records.append(record)
            msg = worker_pb2.GenerateRequest(
                request_id=f"replay-{i}-{time.monotonic_ns()}", token_ids=tokens,
                sampling=common_pb2.SamplingParams(max_tokens=record.max_tokens, ignore_eos=True))
            async for frame in stub.Generate(msg):
                if frame.HasField("prompt"):
                    record.worker_id = frame.prompt.worker_id
                    record.cached_tokens = frame.prompt.cached_tokens
                if frame.token_ids and record.first_token_ms is None:
                    record.first_token_ms = now_ms()
                record.output_tokens += len(frame.token_ids)
            record.finish_ms = now_ms()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(trace)))
        return summarise(records, now_ms())
