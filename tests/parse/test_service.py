"""The parse service in-process against a scripted fake router (a unit test of Parse, not an e2e test)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import grpc
import pytest

from gateway.parse_client import ParseClient
from services.api import chat_pb2, common_pb2, parse_pb2, parse_pb2_grpc, router_pb2, router_pb2_grpc, worker_pb2
from services.common import message_reuse, mux, token_bytes
from services.common.grpc_util import GrpcServer, open_channel
from services.common.message_reuse import MessageStore
from services.common.model_dir import load_model_dir
from services.launcher.supervisor import free_port
from services.parse import convert
from services.parse.metrics import ParseMetrics
from services.parse.model_format import ModelFormat, Prompt
from services.parse.server import RunningParse, start
from services.parse.service import ParseService, router_request
from services.parse.settings import ParseSettings

DEMO = load_model_dir(None)
OUTPUT = ('<think>\nNeed the weather.\n</think>\n\n'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>')

Script = Callable[[worker_pb2.GenerateRequest, Any], AsyncIterator[worker_pb2.GenerateResponse]]


class FakeRouter(router_pb2_grpc.RouterServicer):
    """Streams whatever the current script yields and remembers the requests."""

    def __init__(self) -> None:
        self.workers: list[worker_pb2.WorkerInfo] = []
        self.requests: list[worker_pb2.GenerateRequest] = []
        self.script: Script = scripted(OUTPUT)

    async def Generate(self, request: worker_pb2.GenerateRequest, context: Any) -> AsyncIterator[
            worker_pb2.GenerateResponse]:
        self.requests.append(request)
        async for frame in self.script(request, context):
            yield frame

    async def ListWorkers(self, request: Any, context: Any) -> Any:
        return router_pb2.ListWorkersResponse(workers=self.workers)


def scripted(text: str, batch: int = 4, error_after: int | None = None, abort_after: int | None = None) -> Script:
    ids = [*DEMO.tokenizer.encode(text, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
    frames = [ids[i:i + batch] for i in range(0, len(ids), batch)]

    async def script(request: worker_pb2.GenerateRequest, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        for n, chunk in enumerate(frames):
            if n == error_after:
                yield worker_pb2.GenerateResponse(error=common_pb2.Error(
                    code=common_pb2.ERROR_CODE_UNAVAILABLE, message="worker died"))
                return
            if n == abort_after:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "router lost the worker")
            frame = worker_pb2.GenerateResponse(token_ids=chunk)
            if n == 0:
                frame.prompt.CopyFrom(worker_pb2.PromptInfo(
                    prompt_tokens=token_bytes.count(request.token_ids_u32), cached_tokens=3, worker_id="w1"))
            if n == len(frames) - 1:
                frame.finish_reason = common_pb2.FINISH_REASON_STOP
                frame.usage.CopyFrom(common_pb2.Usage(prompt_tokens=token_bytes.count(request.token_ids_u32),
                                                      completion_tokens=len(ids), cached_tokens=3))
            yield frame

    return script


@pytest.fixture
async def mesh(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[FakeRouter, parse_pb2_grpc.ParseStub, RunningParse]]:
    router_retry = getattr(request, "param", 5.0)  # ``indirect`` parametrization sets --router-retry
    router = FakeRouter()
    router_server = GrpcServer(None, "127.0.0.1", 0)
    router_pb2_grpc.add_RouterServicer_to_server(router, router_server.server)
    router_server.add_mux({mux.method_name("Router", "Generate"):
                           mux.MuxMethod(router.Generate, worker_pb2.GenerateRequest)})
    await router_server.start()
    fmt = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser="hermes", max_model_len=4096)
    parse = await start(ParseSettings(port=0, router_address=router_server.address, router_retry=router_retry),
                        model_format=fmt)
    channel = open_channel(parse.address, None)
    try:
        yield router, parse_pb2_grpc.ParseStub(channel), parse
    finally:
        await channel.close()
        await parse.stop(0)
        await router_server.stop(0)


def chat_request(**kwargs: Any) -> chat_pb2.ChatRequest:
    request = chat_pb2.ChatRequest(
        model="anything",
        messages=[
            chat_pb2.Message(role="system",
                             parts=[chat_pb2.Part(text="x-anthropic-billing-header: cch=1;\nBe brief.")]),
            chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="Weather in Paris?")]),
        ],
        tools=[chat_pb2.Tool(name="get_weather", description="Weather",
                             parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}')],
        identity=common_pb2.Identity(session_id="s1", trajectory_id="t1"),
        **kwargs,
    )
    return request


async def collect(stub: parse_pb2_grpc.ParseStub, request: chat_pb2.ChatRequest) -> list[chat_pb2.ChatEventBatch]:
    return [batch async for batch in stub.Chat(request)]


def kinds(batches: list[chat_pb2.ChatEventBatch]) -> list[str]:
    out: list[str] = []
    for batch in batches:
        for event in batch.events:
            kind = str(event.WhichOneof("event"))
            if not out or out[-1] != kind or kind == "tool_call_dispatch":
                out.append(kind)
    return out


async def test_chat_event_order_and_request(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, parse = mesh
    batches = await collect(stub, chat_request(sampling=common_pb2.SamplingParams(max_tokens=100)))
    assert kinds(batches) == ["started", "reasoning_delta", "tool_call_start", "tool_call_arguments_delta",
                              "tool_call_dispatch", "usage", "finish"]
    events = [e for b in batches for e in b.events]
    started = events[0].started
    assert (started.model, started.worker_id, started.cached_tokens) == ("demo_model", "w1", 3)
    assert started.request_id and started.prompt_tokens == token_bytes.count(router.requests[0].token_ids_u32)
    reasoning = "".join(e.reasoning_delta.text for e in events if e.HasField("reasoning_delta"))
    assert reasoning == "Need the weather."
    dispatch = next(e.tool_call_dispatch for e in events if e.HasField("tool_call_dispatch"))
    args = "".join(e.tool_call_arguments_delta.delta for e in events if e.HasField("tool_call_arguments_delta"))
    assert dispatch.call.arguments_json == args == '{"city": "Paris", "unit": "celsius"}'
    assert dispatch.call.name == "get_weather" and dispatch.call.id.startswith("call_")
    assert events[-1].finish.reason == common_pb2.FINISH_REASON_TOOL_CALLS
    assert events[-2].usage.completion_tokens > 0
    # Batching preserved: at most one frame per router frame (never one per token).
    n_ids = len(DEMO.tokenizer.encode(OUTPUT, add_special_tokens=False).ids) + 1
    assert len(batches) <= -(-n_ids // 4)
    sent = router.requests[0]
    assert list(sent.stop_token_ids) == list(DEMO.eos_token_ids)
    assert sent.match_text == "Weather in Paris?"
    assert sent.identity.session_id == "s1" and sent.sampling.max_tokens == 100 and sent.model == "demo_model"
    rendered = parse.model_format.decode(token_bytes.unpack(sent.token_ids_u32))
    assert "billing" not in rendered and rendered.endswith("<|im_start|>assistant\n")


async def test_usage_counts_the_reasoning_tokens(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    """``usage.reasoning_tokens``: the tokens the reasoning parser classified as reasoning (one token per frame)."""
    router, stub, _ = mesh
    router.script = scripted(OUTPUT, batch=1)
    events = [e for b in await collect(stub, chat_request()) for e in b.events]
    (usage,) = [e.usage for e in events if e.HasField("usage")]
    assert usage.reasoning_tokens == len(DEMO.tokenizer.encode("Need the weather.", add_special_tokens=False).ids)
    assert usage.completion_tokens > usage.reasoning_tokens


async def test_router_error_mid_stream_is_in_band(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _ = mesh
    router.script = scripted(OUTPUT, error_after=3)
    events = [e for b in await collect(stub, chat_request()) for e in b.events]
    assert events[0].HasField("started")
    assert events[-1].error.code == common_pb2.ERROR_CODE_UNAVAILABLE
    assert events[-1].error.message == "worker died"
    assert not any(e.HasField("finish") for e in events)


@pytest.mark.parametrize("mesh", [0.0], indirect=True)  # no retry budget
async def test_router_abort_mid_stream_is_in_band(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _ = mesh
    router.script = scripted(OUTPUT, abort_after=2)
    events = [e for b in await collect(stub, chat_request()) for e in b.events]
    assert events[0].HasField("started")
    assert events[-1].error.code == common_pb2.ERROR_CODE_UNAVAILABLE
    assert "router lost the worker" in events[-1].error.message


async def test_error_before_first_frame_is_a_status(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _ = mesh
    router.script = scripted(OUTPUT, error_after=0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat_request())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_context_length_and_bad_requests(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _ = mesh
    long_prompt = chat_request()
    long_prompt.messages[-1].parts[0].text = "word " * 5000  # the fixture's context is 4,096 tokens
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, long_prompt)
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat_request(chat_template_kwargs_json="{oops"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("harnessmesh-error-param", "chat_template_kwargs_json") in tuple(info.value.trailing_metadata() or ())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat_pb2.ChatRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert router.requests == []


async def test_max_tokens_beyond_the_context_is_clamped(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _ = mesh
    await collect(stub, chat_request(sampling=common_pb2.SamplingParams(max_tokens=5000)))
    sent = router.requests[-1]
    assert sent.sampling.max_tokens == 4096 - token_bytes.count(sent.token_ids_u32)


def test_router_request_fits_max_tokens_without_touching_the_client_request() -> None:
    client = chat_request(sampling=common_pb2.SamplingParams(max_tokens=5000, temperature=0.5))
    sent, packed = router_request(client, Prompt("hi", [1, 2, 3], "hi"), 4093, request_id="r1", model="m",
                                  stop_token_ids=(9,))
    assert (sent.sampling.max_tokens, sent.sampling.temperature) == (4093, 0.5)
    assert token_bytes.unpack(packed) == [1, 2, 3] and not sent.token_ids_u32  # the prompt goes beside it
    assert client.sampling.max_tokens == 5000


async def test_tokenize_detokenize_get_model(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _parse = mesh
    await collect(stub, chat_request())
    reply = await stub.Tokenize(parse_pb2.TokenizeRequest(chat=chat_request()))
    assert list(reply.token_ids) == token_bytes.unpack(router.requests[0].token_ids_u32)  # what Chat sends the worker
    assert list(reply.token_ids) == DEMO.tokenizer.encode(reply.rendered, add_special_tokens=False).ids
    assert reply.max_model_len == 4096
    raw = await stub.Tokenize(parse_pb2.TokenizeRequest(prompt="hello world"))
    assert list(raw.token_ids) == DEMO.tokenizer.encode("hello world").ids and raw.rendered == ""
    text = await stub.Detokenize(parse_pb2.DetokenizeRequest(token_ids=reply.token_ids))
    assert text.text == reply.rendered
    model = await stub.GetModel(chat_pb2.ModelInfoRequest())
    assert (model.served_model_name, model.max_model_len, model.reasoning_parser, model.tool_parser) == (
        "demo_model", 4096, "qwen3", "hermes")
    assert model.created > 0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Tokenize(parse_pb2.TokenizeRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_client_cancel_cancels_the_router_call(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    router, stub, _ = mesh
    cancelled = asyncio.Event()

    async def hang(request: worker_pb2.GenerateRequest, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        yield worker_pb2.GenerateResponse(token_ids=[10], prompt=worker_pb2.PromptInfo(prompt_tokens=1))
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.set()

    router.script = hang
    call = stub.Chat(chat_request())
    first = await call.read()
    assert first.events[0].HasField("started")
    call.cancel()
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_session_turns_build_incrementally_and_are_counted() -> None:
    """A session's second turn reuses the first's ids (same ids as a full build); the metric counts each build
    by kind and reason, and an anonymous request is never cached."""
    fmt = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser="hermes")
    service = ParseService(fmt, cast(Any, None), metrics=ParseMetrics())
    first = chat_request()
    second = chat_request()
    second.messages.extend([
        chat_pb2.Message(role="assistant", parts=[chat_pb2.Part(text="Checking.")]),
        chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="And in Rome?")]),
    ])
    anonymous = chat_request()
    anonymous.identity.anonymous = True
    prompts = [(await service._prompt(r, {}))[1] for r in (first, second, anonymous)]
    assert [(p.build, p.build_reason) for p in prompts] == [
        ("full", "new_key"), ("incremental", "extends"), ("full", "anonymous")]
    assert list(prompts[1].token_ids) == DEMO.tokenizer.encode(prompts[1].text, add_special_tokens=False).ids
    assert 0 < prompts[1].reused_tokens < len(prompts[1].token_ids)
    registry = service.metrics.registry
    for build, reason in (("full", "new_key"), ("incremental", "extends"), ("full", "anonymous")):
        labels = {"build": build, "reason": reason}
        assert registry.get_sample_value("harnessmesh_parse_prompt_builds_total", labels) == 1
    assert registry.get_sample_value("harnessmesh_parse_prompt_reused_tokens_total") == prompts[1].reused_tokens


async def test_ready_asks_the_router_for_routable_workers(
    mesh: tuple[FakeRouter, parse_pb2_grpc.ParseStub, RunningParse],
) -> None:
    router, stub, _ = mesh
    reply = await stub.Ready(parse_pb2.ReadyRequest())
    assert not reply.ready and "no worker is routable" in reply.reason
    router.workers = [worker_pb2.WorkerInfo(worker_id="w1", grpc_address="127.0.0.1:1")]
    reply = await stub.Ready(parse_pb2.ReadyRequest())
    assert reply.ready and reply.workers == 1 and not reply.reason


async def test_ready_says_why_when_the_router_is_down() -> None:
    fmt = ModelFormat(DEMO, max_model_len=4096)
    parse = await start(ParseSettings(port=0, router_address=f"127.0.0.1:{free_port()}"), model_format=fmt)
    channel = open_channel(parse.address, None)
    try:
        reply = await parse_pb2_grpc.ParseStub(channel).Ready(parse_pb2.ReadyRequest())
        assert not reply.ready and "the router does not answer: UNAVAILABLE" in reply.reason
    finally:
        await channel.close()
        await parse.stop(0)


async def test_a_router_lost_mid_stream_is_continued_with_the_tokens_so_far(
    mesh: tuple[FakeRouter, Any, RunningParse],
) -> None:
    router, stub, _ = mesh
    ids = [*DEMO.tokenizer.encode(OUTPUT, add_special_tokens=False).ids, DEMO.eos_token_ids[0]]
    calls = 0

    async def script(request: worker_pb2.GenerateRequest, context: Any) -> AsyncIterator[worker_pb2.GenerateResponse]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the router dies after 8 tokens
            first = worker_pb2.GenerateResponse(token_ids=ids[:4])
            first.prompt.CopyFrom(worker_pb2.PromptInfo(prompt_tokens=token_bytes.count(request.token_ids_u32),
                                                        cached_tokens=3, worker_id="w1"))
            yield first
            yield worker_pb2.GenerateResponse(token_ids=ids[4:8])
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        done = token_bytes.count(request.token_ids_u32) - token_bytes.count(router.requests[0].token_ids_u32)
        rest = ids[done:]
        again = worker_pb2.GenerateResponse(token_ids=rest[:4])
        again.prompt.CopyFrom(worker_pb2.PromptInfo(prompt_tokens=token_bytes.count(request.token_ids_u32),
                                                    cached_tokens=99, worker_id="w2"))
        yield again
        last = worker_pb2.GenerateResponse(token_ids=rest[4:], finish_reason=common_pb2.FINISH_REASON_STOP)
        last.usage.CopyFrom(common_pb2.Usage(prompt_tokens=token_bytes.count(request.token_ids_u32),
                                             completion_tokens=len(rest), cached_tokens=99))
        yield last

    router.script = script
    events = [e for b in await collect(stub, chat_request(sampling=common_pb2.SamplingParams(max_tokens=200)))
              for e in b.events]
    first, resumed = router.requests
    assert token_bytes.unpack(resumed.token_ids_u32) == token_bytes.unpack(first.token_ids_u32) + ids[:8]
    assert resumed.sampling.max_tokens == first.sampling.max_tokens - 8
    assert [e.WhichOneof("event") for e in events].count("started") == 1
    assert not any(e.HasField("error") for e in events)
    text = "".join(e.reasoning_delta.text for e in events if e.HasField("reasoning_delta"))
    assert text.strip() == "Need the weather."  # every token once, in order, across the two streams
    (call,) = [e.tool_call_dispatch for e in events if e.HasField("tool_call_dispatch")]
    assert call.call.name == "get_weather" and '"Paris"' in call.call.arguments_json
    (usage,) = [e.usage for e in events if e.HasField("usage")]
    assert usage.completion_tokens == len(ids)  # 8 from the lost stream + the rest
    assert usage.prompt_tokens == token_bytes.count(first.token_ids_u32) and usage.cached_tokens == 3


def _next_turn(request: chat_pb2.ChatRequest) -> chat_pb2.ChatRequest:
    out = chat_pb2.ChatRequest()
    out.CopyFrom(request)
    out.messages.extend([
        chat_pb2.Message(role="assistant", parts=[chat_pb2.Part(text="Checking.")]),
        chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="And in Rome?")]),
    ])
    return out


async def _events(client: ParseClient, request: chat_pb2.ChatRequest) -> list[str]:
    return [e.WhichOneof("event") or "" async for batch in client.chat(request) for e in batch.events]


async def test_a_next_turn_reaches_parse_as_its_new_messages_and_renders_as_whole(
    mesh: tuple[FakeRouter, Any, RunningParse], monkeypatch: pytest.MonkeyPatch
) -> None:
    router, _, parse = mesh
    monkeypatch.setattr(message_reuse, "MIN_REUSE_BYTES", 16)  # the fixture's model has a 4k context
    channel = open_channel(parse.address, None)
    client = ParseClient(channel)
    first = chat_request()
    second = _next_turn(first)
    expected = parse.model_format.build_prompt(convert.conversation_from_proto(_next_turn(chat_request())))
    try:
        assert (await client.get_model()).accepts_messages_base  # (endpoints resolve the model first)
        for request in (first, second):
            assert (await _events(client, request))[-1] == "finish"
    finally:
        await channel.close()
    assert parse.servicer is not None
    assert (client.messages.shortened, parse.servicer.messages.rebuilt) == (1, 1)
    assert token_bytes.unpack(router.requests[-1].token_ids_u32) == list(expected.token_ids)


async def test_an_agents_next_turn_is_built_on_the_loop_and_a_reworded_one_tokenized_in_a_thread(
    mesh: tuple[FakeRouter, Any, RunningParse], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A continued conversation's next turn (a few new messages after those parse holds) is converted, rendered
    and tokenized on the event loop: four thread hand-offs were ~0.8 ms of a cached 100k-token turn. Its
    tokenization goes to a thread when most of the prompt's text is new (here: the tools changed, and they
    render at its start)."""
    import threading

    from services.parse import service as parse_service

    router, _, parse = mesh
    monkeypatch.setattr(message_reuse, "MIN_REUSE_BYTES", 16)
    monkeypatch.setattr(parse_service, "INLINE_WORK_BYTES", 2000)  # the fixture's model has a 4k context
    fmt = parse.model_format
    on_loop: dict[str, list[bool]] = {"render": [], "tokenize": []}
    render, tokenize = fmt.render, fmt.tokenize_prompt

    def rendering(*args: Any, **kwargs: Any) -> Any:
        on_loop["render"].append(threading.current_thread() is threading.main_thread())
        return render(*args, **kwargs)

    def tokenizing(*args: Any, **kwargs: Any) -> Any:
        on_loop["tokenize"].append(threading.current_thread() is threading.main_thread())
        return tokenize(*args, **kwargs)

    monkeypatch.setattr(fmt, "render", rendering)
    monkeypatch.setattr(fmt, "tokenize_prompt", tokenizing)
    first = chat_request()
    first.messages.append(chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="history " * 300)]))  # 2.4 KB
    second = _next_turn(first)
    retooled = _next_turn(second)
    retooled.tools.append(chat_pb2.Tool(name="search", description="Search the code. " * 150,
                                        parameters_json='{"type": "object", "properties": {}}'))
    channel = open_channel(parse.address, None)
    client = ParseClient(channel)
    try:
        await client.get_model()
        for request in (first, second, retooled):
            assert (await _events(client, request))[-1] == "finish"
    finally:
        await channel.close()
    assert parse.servicer is not None and parse.servicer.messages.rebuilt == 2
    # the first turn (over the limit, no base) is built in a thread; its next turn wholly on the loop; the
    # retooled one is rendered on the loop (its own messages are few and small) and tokenized in a thread
    assert on_loop == {"render": [False, True, True], "tokenize": [False, True, False]}
    for request, sent in zip((second, retooled), router.requests[1:], strict=True):
        whole = fmt.build_prompt(convert.conversation_from_proto(request))
        assert token_bytes.unpack(sent.token_ids_u32) == list(whole.token_ids)


async def test_parse_without_the_base_refuses_and_the_gateway_sends_the_turn_whole(
    mesh: tuple[FakeRouter, Any, RunningParse], monkeypatch: pytest.MonkeyPatch
) -> None:
    router, _, parse = mesh
    monkeypatch.setattr(message_reuse, "MIN_REUSE_BYTES", 16)
    assert parse.servicer is not None
    channel = open_channel(parse.address, None)
    client = ParseClient(channel)
    try:
        await client.get_model()
        await _events(client, chat_request())
        parse.servicer.messages = MessageStore()  # as after a parse restart
        events = await _events(client, _next_turn(chat_request()))
    finally:
        await channel.close()
    assert events.count("started") == 1 and events[-1] == "finish"
    assert (parse.servicer.messages.refused, parse.servicer.messages.rebuilt) == (1, 0)
    assert len(router.requests) == 2  # the refused request never reached the router


async def test_a_client_cannot_name_a_base_parse_holds(mesh: tuple[FakeRouter, Any, RunningParse]) -> None:
    _, stub, parse = mesh
    channel = open_channel(parse.address, None)
    client = ParseClient(channel)
    forged = chat_request()
    forged.messages_base.count = 1
    forged.messages_key = "s:someone-else"
    try:
        assert (await _events(client, forged))[-1] == "finish"  # the gateway cleared both fields
    finally:
        await channel.close()
    with pytest.raises(grpc.aio.AioRpcError) as info:  # straight to parse: only Chat takes a base
        await stub.Tokenize(parse_pb2.TokenizeRequest(chat=forged))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_parse_that_predates_bases_gets_every_message(
    mesh: tuple[FakeRouter, Any, RunningParse], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, parse = mesh
    monkeypatch.setattr(message_reuse, "MIN_REUSE_BYTES", 16)
    channel = open_channel(parse.address, None)
    client = ParseClient(channel)
    try:
        info = await client.get_model()
        info.accepts_messages_base = False  # what an older parse's ModelInfo says (the field unset)
        for request in (chat_request(), _next_turn(chat_request())):
            assert (await _events(client, request))[-1] == "finish"
    finally:
        await channel.close()
    assert parse.servicer is not None
    assert (client.messages.shortened, parse.servicer.messages.rebuilt) == (0, 0)


async def test_a_large_requests_checks_and_conversion_run_off_the_event_loop(
    mesh: tuple[FakeRouter, Any, RunningParse], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Converting 40k messages holds a thread ~0.3 s: on the event loop that silenced the service's mux
    heartbeats past the gateway's liveness window (a 503 for a request that deserved its 400)."""
    import threading

    _, stub, _ = mesh
    threads: list[threading.Thread] = []
    convert_one = convert.conversation_from_proto

    def recording(request: chat_pb2.ChatRequest, held: Any = ()) -> Any:
        threads.append(threading.current_thread())
        return convert_one(request, held)

    monkeypatch.setattr(convert, "conversation_from_proto", recording)
    await collect(stub, chat_request())
    large = chat_request()
    large.messages.extend(chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=f"m{i}")]) for i in range(100))
    await collect(stub, large)
    assert threads[0] is threading.main_thread()  # small: a thread hand-off would cost more than the work
    assert threads[1] is not threading.main_thread()


async def test_a_large_requests_message_digests_are_worked_out_off_the_event_loop(
    mesh: tuple[FakeRouter, Any, RunningParse], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the message store keeps of a request (a digest per message: ~27 ms for 10,000) is worked out
    with its conversion, in a thread for a large one; only the store's update runs on the loop."""
    import threading

    from services.common.message_reuse import MessageStore

    _, stub, running = mesh
    threads: list[threading.Thread] = []
    prepare = MessageStore.prepare

    def recording(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return prepare(*args)

    monkeypatch.setattr(MessageStore, "prepare", staticmethod(recording))
    small = chat_request()
    small.messages_key = "s:small/t"
    await collect(stub, small)
    large = chat_request()
    large.messages.extend(chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=f"m{i}")]) for i in range(100))
    large.messages_key = "s:large/t"
    await collect(stub, large)
    assert threads[0] is threading.main_thread()
    assert threads[1] is not threading.main_thread()
    assert running.servicer is not None
    next_turn = chat_pb2.ChatRequest(messages_key="s:large/t")
    next_turn.messages_base.count = len(large.messages)
    assert len(running.servicer.messages.base_digests(next_turn)) == len(large.messages)  # kept all the same
