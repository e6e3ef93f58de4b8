"""Replay a trace against a live router (mocker workers) at a time-compression factor.

The schedule is the simulator's: arrival ``i`` at ``(timestamp_i - timestamp_0) / speedup`` ms of simulated
time. ``compression`` maps simulated time to wall time (one wall second is ``compression`` simulated
seconds): arrivals are sent ``compression`` times sooner, the workers must run their timing model with
``--speedup compression`` (:mod:`services.launcher.live_mesh` starts them so), and every time measured on the client is
multiplied back by ``compression``. The results are then in the simulator's units and directly comparable.

Each request is the trace's synthetic prompt (:meth:`TraceRequest.tokens`, the simulator's tokens) and asks
for exactly its ``output_length`` tokens (``ignore_eos``). TTFT and TPOT are measured on the client; prefix
reuse comes from the ``cached_tokens`` each worker reports in its prompt frame.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc

from services.api import common_pb2, router_pb2_grpc, worker_pb2
from services.common import token_bytes
from services.replay.metrics import ReplayResult, RequestRecord, summarise
from services.replay.trace import TraceRequest


async def replay_live(trace: list[TraceRequest], router_address: str, speedup: float = 1.0,
                      compression: float = 1.0) -> ReplayResult:
    """Send every trace request to ``router_address`` on the trace's schedule (see module docstring)."""
    if speedup <= 0 or compression <= 0:
        raise ValueError("speedup and compression must be positive")
    records: list[RequestRecord] = []
    run = uuid.uuid4().hex[:8]
    t0 = trace[0].timestamp_ms if trace else 0.0
    # built before the clock starts: a 100k-token message takes milliseconds to build
    messages = [
        worker_pb2.GenerateRequest(
            request_id=f"replay-{run}-{i}", token_ids_u32=token_bytes.pack(req.tokens()),
            sampling=common_pb2.SamplingParams(max_tokens=max(req.output_length, 1), ignore_eos=True))
        for i, req in enumerate(trace)]
    async with grpc.aio.insecure_channel(router_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        loop = asyncio.get_running_loop()
        start = loop.time()

        def now_ms() -> float:  # simulated ms since the first arrival
            return (loop.time() - start) * 1000.0 * compression

        async def one(i: int) -> None:
            msg = messages[i]
            record = RequestRecord(f"r{i}", now_ms(), token_bytes.count(msg.token_ids_u32), msg.sampling.max_tokens, "")
            records.append(record)
            try:
                async for frame in stub.Generate(msg):
                    if frame.HasField("prompt"):
                        record.worker_id = frame.prompt.worker_id
                        record.cached_tokens = frame.prompt.cached_tokens
                    if frame.token_ids and record.first_token_ms is None:
                        record.first_token_ms = now_ms()
                    record.output_tokens += len(frame.token_ids)
                    if frame.HasField("error"):
                        record.error = frame.error.message or "error"
            except grpc.aio.AioRpcError as exc:
                record.error = f"{exc.code().name}: {exc.details()}"
            record.finish_ms = now_ms()

        # One dispatcher, in trace order: requests due at the same time still leave in the simulator's order.
        tasks = []
        for i, req in enumerate(trace):
            due_ms = (req.timestamp_ms - t0) / speedup
            await asyncio.sleep(max(0.0, (due_ms - now_ms()) / 1000.0 / compression))
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(0)  # let it start its call before the next one
        await asyncio.gather(*tasks)
        return summarise(records, now_ms())
