"""The real worker in-process: gRPC Generate over a channel, KV events and heartbeats on a real NATS."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import nats
import pytest

from services.api import common_pb2, kv_pb2, kv_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common import subjects, token_bytes
from services.common.block_hash import sequence_hashes
from services.common.grpc_util import open_channel
from services.worker.registry import ENGINES
from services.worker.server import RunningWorker, start_worker
from services.worker.settings import ENGINE_NAMES, WorkerSettings
from tests.worker.conftest import TOOL_CALL


@pytest.fixture
async def worker(nats_url: str, tmp_path: Path) -> AsyncIterator[RunningWorker]:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"match": "weather", "completion": TOOL_CALL}) + "\n")
    settings = WorkerSettings(nats_url=nats_url, speedup=1000, num_blocks=1024, script=str(script),
                              namespace=f"t{tmp_path.name[-8:]}", heartbeat_interval=0.2)
    w = await start_worker(settings)
    yield w
    await w.stop(grace=0.1)


async def stub_for(w: RunningWorker) -> tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerAsyncStub]:
    channel = open_channel(w.address, None)
    return channel, worker_pb2_grpc.WorkerStub(channel)  # type: ignore[return-value]


def gen_request(token_ids: list[int], **kw: object) -> worker_pb2.GenerateRequest:
    sampling = common_pb2.SamplingParams(max_tokens=kw.pop("max_tokens", 0))  # type: ignore[arg-type]
    return worker_pb2.GenerateRequest(token_ids_u32=token_bytes.pack(token_ids), sampling=sampling, **kw)  # type: ignore[arg-type]


async def test_generate_stream_and_kv_events(worker: RunningWorker, nats_url: str) -> None:
    ns = worker.publisher.kv_subject.split(".")[1]
    nc = await nats.connect(nats_url)
    batches: list[kv_pb2.KvEventBatch] = []
    got = asyncio.Event()

    async def on_kv(msg: object) -> None:
        batches.append(kv_pb2.KvEventBatch.FromString(msg.data))  # type: ignore[attr-defined]
        got.set()

    await nc.subscribe(subjects.kv_events(ns, worker.worker_id), cb=on_kv)
    await nc.flush()
    channel, stub = await stub_for(worker)
    prompt = list(range(200, 264))
    frames = [f async for f in stub.Generate(gen_request(prompt, request_id="g1", match_text="weather?"))]
    await asyncio.sleep(0.1)  # the publisher drains the engine's events
    dump = await kv_pb2_grpc.KvRecoveryStub(channel).Dump(kv_pb2.KvDumpRequest())
    await channel.close()
    # the dump gives each block's parent, so a router that repairs from it keeps its chains (router/index.py)
    parent_of = {h: (p if has else None)
                 for h, p, has in zip(dump.block_hashes, dump.parent_hashes, dump.has_parent, strict=True)}
    hashes = sequence_hashes(prompt, 16)
    assert dump.chained and [parent_of[h] for h in hashes[:4]] == [None, *hashes[:3]]

    assert frames[0].HasField("prompt")
    assert frames[0].prompt.prompt_tokens == 64 and frames[0].prompt.worker_id == worker.worker_id
    assert all(not f.HasField("prompt") for f in frames[1:])
    last = frames[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_STOP
    assert last.usage.prompt_tokens == 64 and last.usage.completion_tokens > 0
    text = worker.engine.model.tokenizer.decode(  # type: ignore[attr-defined]
        [t for f in frames for t in f.token_ids], skip_special_tokens=False)
    assert text == TOOL_CALL

    await asyncio.wait_for(got.wait(), 5)
    await asyncio.sleep(0.1)
    events = [e for b in batches for e in b.events]
    assert all(b.worker_id == worker.worker_id for b in batches)
    assert [e.event_id for e in events] == list(range(1, len(events) + 1))
    stored = [h for e in events if e.HasField("stored") for h in e.stored.block_hashes]
    assert stored[:4] == sequence_hashes(prompt, 16)
    assert not events[0].stored.has_parent
    assert list(worker.publisher.recent) == events
    await nc.close()


async def test_info_heartbeat_and_discover(worker: RunningWorker, nats_url: str) -> None:
    ns = worker.publisher.kv_subject.split(".")[1]
    channel, stub = await stub_for(worker)
    info = await stub.Info(worker_pb2.WorkerInfoRequest())
    await channel.close()
    assert info.worker_id == worker.worker_id and info.grpc_address == worker.address
    assert (info.block_size, info.total_blocks, info.engine) == (16, 1024, "mocker")

    nc = await nats.connect(nats_url)
    beats: asyncio.Queue[kv_pb2.WorkerHeartbeat] = asyncio.Queue()

    async def on_beat(msg: object) -> None:
        await beats.put(kv_pb2.WorkerHeartbeat.FromString(msg.data))  # type: ignore[attr-defined]

    await nc.subscribe(subjects.heartbeat(ns), cb=on_beat)
    await nc.flush()
    beat = await asyncio.wait_for(beats.get(), 2)  # periodic
    assert beat.info == info and not beat.leaving
    while not beats.empty():
        beats.get_nowait()
    await nc.publish(subjects.discover(ns), b"")
    beat = await asyncio.wait_for(beats.get(), 0.15)  # answered before the next periodic one
    assert beat.info.worker_id == worker.worker_id

    await worker.publisher.leave()
    while True:
        beat = await asyncio.wait_for(beats.get(), 2)
        if beat.leaving:
            break
    await nc.close()


async def test_errors_before_first_frame_are_statuses(worker: RunningWorker) -> None:
    channel, stub = await stub_for(worker)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in stub.Generate(gen_request([])):
            pass
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in stub.Generate(gen_request(list(range(1024 * 16)))):
            pass
    assert exc.value.code() == grpc.StatusCode.OUT_OF_RANGE
    await channel.close()


async def test_client_cancel_frees_blocks(worker: RunningWorker) -> None:
    engine = worker.engine
    baseline = engine.stats().active_blocks
    channel, stub = await stub_for(worker)
    call = stub.Generate(gen_request(list(range(300, 400)), max_tokens=100000))
    async for frame in call:
        assert frame.token_ids or frame.HasField("prompt")
        break
    assert engine.stats().active_requests == 1  # ~32k tokens to go: surely mid-stream
    assert engine.stats().active_blocks > baseline
    call.cancel()
    for _ in range(100):
        if engine.stats().active_requests == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.stats().active_requests == 0
    assert engine.stats().active_blocks == baseline
    await channel.close()


def test_engine_registry_is_pinned() -> None:
    assert set(ENGINES) == set(ENGINE_NAMES) == {"mocker", "torch", "trtllm", "trtllm-grpc"}


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="valid engines: mocker"):
        WorkerSettings(engine="vllm").validate()
    with pytest.raises(ValueError, match="speedup"):
        WorkerSettings(speedup=0).validate()


def test_help_works() -> None:
    out = subprocess.run([sys.executable, "-m", "services.worker", "--help"], capture_output=True, text=True,
                         timeout=30, check=True)
    for flag in ("--speedup", "--script", "--num-blocks", "--nats-url", "--decode-ms-base"):
        assert flag in out.stdout


async def test_bad_script_fails_at_start(nats_url: str, tmp_path: Path) -> None:
    script = tmp_path / "bad.jsonl"
    script.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        await start_worker(WorkerSettings(nats_url=nats_url, script=str(script)))
