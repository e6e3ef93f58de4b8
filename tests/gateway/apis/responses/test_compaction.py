"""Compaction on the Responses API (``gateway/apis/responses/compaction.py``) against real uvicorn and a fake parse
service: the ``compaction_trigger`` form (streamed and not), ``POST /v1/responses/compact``, the round trip of a
sealed ``compaction`` item, its tampering (400), and Codex's local compaction rendered with its tools."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from gateway.apis.responses.compaction import SUMMARY_PREFIX, compaction_sealer
from gateway.catalog import DEFAULT_COMPACTION_INSTRUCTION
from gateway.server import Gateway
from services.api import chat_pb2
from tests.gateway.apis.responses.test_replay import _DROP_HEADERS, EVENTS
from tests.gateway.fake_parse import FakeParse, batch, finish, reasoning, started, text, usage
from tests.support.fixtures import CAPTURES

TOOLS: Any = [{"type": "function", "name": "exec_command", "description": "run a command",
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
CONVERSATION: Any = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "base prompt"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run the tests"}]},
    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "pytest"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "3 passed"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "All 3 pass."}]},
]
SUMMARY = "The user ran the tests; 3 passed."


def summary_turn(prompt: int = 900, cached: int = 880) -> list[chat_pb2.ChatEventBatch]:
    """The model thinks, then writes the summary (its reasoning is no part of it)."""
    return [batch(started(prompt, cached), reasoning("summarize"), text("The user ran the tests; "), text("3 passed.")),
            batch(finish(), usage(prompt, 12, cached))]


def sse_events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]


def text_of(message: chat_pb2.Message) -> str:
    return "".join(p.text for p in message.parts)


async def test_a_trigger_gets_exactly_one_compaction_item_and_the_request_renders_as_the_turn_before(
        gateway: Gateway, fake: FakeParse) -> None:
    body = {"model": "demo", "tools": TOOLS, "stream": True, "store": False,
            "input": [*CONVERSATION, {"type": "compaction_trigger"}]}
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        fake.script = summary_turn()
        await_turn = await http.post("/v1/responses", json={**body, "input": CONVERSATION, "stream": False})
        assert await_turn.status_code == 200, await_turn.text
        fake.script = summary_turn()
        reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    events = sse_events(reply.text)
    for event in events:
        EVENTS.validate_python(event)  # the openai SDK's typed stream event
    assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                           "response.compaction.compacting",  # the model wrote (no content)
                                           "response.output_item.added", "response.output_item.done",
                                           "response.completed"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert len(done) == 1 and done[0]["type"] == "compaction" and set(done[0]) == {"id", "type", "encrypted_content"}
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["output"] == done
    assert completed["usage"]["input_tokens_details"]["cached_tokens"] == 880
    assert compaction_sealer("").open(done[0]["encrypted_content"]) is None  # another key cannot open it
    # The compaction request is the previous turn's request (tools included) plus the instruction.
    turn, compacting = fake.requests[-2], fake.requests[-1]
    assert list(compacting.tools) == list(turn.tools) and len(turn.tools) == 1
    assert list(compacting.messages)[:-1] == list(turn.messages)
    assert compacting.messages[-1].role == "user"
    assert text_of(compacting.messages[-1]) == DEFAULT_COMPACTION_INSTRUCTION


async def test_a_compaction_item_round_trips_to_its_summary_and_a_changed_one_is_refused(
        gateway: Gateway, fake: FakeParse) -> None:
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        fake.script = summary_turn()
        reply = await http.post("/v1/responses", json={"model": "demo", "tools": TOOLS,
                                                       "input": [*CONVERSATION, {"type": "compaction_trigger"}]})
        assert reply.status_code == 200, reply.text
        (item,) = reply.json()["output"]
        assert item["type"] == "compaction"
        # Codex's next window: the user messages it keeps, the compaction item, then the new prompt.
        fake.script = [batch(started(), text("ok")), batch(finish(), usage(7, 1))]
        after = [CONVERSATION[1], item, {"role": "user", "content": "now fix the lint"}]
        reply = await http.post("/v1/responses", json={"model": "demo", "tools": TOOLS, "input": after})
        assert reply.status_code == 200, reply.text
        messages = list(fake.requests[-1].messages)
        assert [m.role for m in messages] == ["user", "user", "user"]
        assert text_of(messages[1]) == SUMMARY_PREFIX + SUMMARY  # expanded where it stands
        sent = len(fake.requests)
        blob = item["encrypted_content"]
        body, _, mac = blob.rpartition(".")
        for bad in [body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + mac,  # changed text
                    blob + "x",                                                       # changed MAC
                    compaction_sealer("another-key").seal(SUMMARY),                   # another gateway's key
                    "gAAAAABopenai-encrypted",                                       # another provider's
                    ""]:
            changed = [after[0], {**item, "encrypted_content": bad}, after[2]]
            reply = await http.post("/v1/responses", json={"model": "demo", "input": changed})
            assert reply.status_code == 400, (bad, reply.text)
            error = reply.json()["error"]
            assert error["param"] == "input[1].encrypted_content" and error["message"].startswith("input[1]: ")
        assert len(fake.requests) == sent  # refused before the model was asked


async def test_the_v1_compact_endpoint_keeps_the_user_messages_and_adds_one_compaction_item(
        gateway: Gateway, fake: FakeParse) -> None:
    fake.script = summary_turn(prompt=500, cached=480)
    body = {"model": "demo", "instructions": "base prompt", "tools": TOOLS, "parallel_tool_calls": True,
            "input": CONVERSATION[1:]}
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        reply = await http.post("/v1/responses/compact", json=body)
        assert reply.status_code == 200, reply.text
        out = reply.json()
        assert out["object"] == "response.compaction" and out["id"].startswith("resp_")
        assert out["output"][:-1] == [CONVERSATION[1]]
        item = out["output"][-1]
        assert item["type"] == "compaction"
        assert out["usage"]["input_tokens"] == 500 and out["usage"]["input_tokens_details"]["cached_tokens"] == 480
        request = fake.requests[-1]
        assert request.messages[0].role == "system" and text_of(request.messages[0]) == "base prompt"
        assert text_of(request.messages[-1]) == DEFAULT_COMPACTION_INSTRUCTION and len(request.tools) == 1
        # The item it made opens on the trigger form too: one code path.
        fake.script = [batch(started(), text("ok")), batch(finish(), usage(7, 1))]
        go = [item, {"role": "user", "content": "go"}]
        reply = await http.post("/v1/responses", json={"model": "demo", "input": go})
        assert reply.status_code == 200, reply.text
        assert text_of(fake.requests[-1].messages[0]) == SUMMARY_PREFIX + SUMMARY


async def test_the_instruction_comes_from_the_model_catalog(fake: FakeParse, gateway_factory: Any,
                                                            fake_parse: Any, tmp_path: Any) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("models:\n  '*':\n    compaction_instruction: 'Summarize in French.'\n")
    gw = await gateway_factory(fake_parse[1], model_catalog=str(catalog))
    fake.script = summary_turn()
    async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
        reply = await http.post("/v1/responses", json={"model": "demo", "input": [
            {"role": "user", "content": "hi"}, {"type": "compaction_trigger"}]})
    assert reply.status_code == 200, reply.text
    assert text_of(fake.requests[-1].messages[-1]) == "Summarize in French."


async def test_a_codex_local_compaction_renders_with_its_conversations_tools(gateway: Gateway,
                                                                            fake: FakeParse) -> None:
    def headers(kind: str) -> dict[str, str]:
        metadata = {"request_kind": kind, "compaction": {"implementation": "responses"}}
        return {"x-codex-turn-metadata": json.dumps(metadata), "session-id": "s1"}

    local = [*CONVERSATION, {"role": "user", "content": "You are performing a CONTEXT CHECKPOINT COMPACTION."}]
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        for path_headers, body in [
            (headers("turn"), {"model": "demo", "tools": TOOLS, "input": CONVERSATION, "prompt_cache_key": "k"}),
            (headers("compaction"), {"model": "demo", "tools": [], "input": local, "prompt_cache_key": "k"}),
            (headers("compaction"), {"model": "demo", "tools": [], "input": local, "prompt_cache_key": "other"}),
            ({}, {"model": "demo", "tools": [], "input": local, "prompt_cache_key": "k"}),
        ]:
            fake.script = [batch(started(), text("summary")), batch(finish(), usage(7, 1))]
            reply = await http.post("/v1/responses", json=body, headers=path_headers)
            assert reply.status_code == 200, reply.text
            assert reply.json()["output"][0]["type"] == "message"  # an ordinary turn to Codex
    turn, local_compaction, other_session, not_codex = fake.requests[-4:]
    assert list(local_compaction.tools) == list(turn.tools) and len(turn.tools) == 1
    assert list(local_compaction.messages)[:len(turn.messages)] == list(turn.messages)
    assert not other_session.tools and not not_codex.tools


async def test_a_compaction_continues_a_stored_response(gateway: Gateway, fake: FakeParse) -> None:
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        fake.script = [batch(started(), text("Done.")), batch(finish(), usage(7, 1))]
        first = await http.post("/v1/responses", json={"model": "demo", "input": "run the tests"})
        assert first.status_code == 200, first.text
        fake.script = summary_turn()
        reply = await http.post("/v1/responses", json={"model": "demo", "previous_response_id": first.json()["id"],
                                                       "input": [{"type": "compaction_trigger"}]})
        assert reply.status_code == 200, reply.text
        assert [i["type"] for i in reply.json()["output"]] == ["compaction"]
        missing = await http.post("/v1/responses/compact", json={"model": "demo", "previous_response_id": "resp_x",
                                                                 "input": []})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "previous_response_id"
    messages = list(fake.requests[-1].messages)
    assert [(m.role, text_of(m)) for m in messages] == [
        ("user", "run the tests"), ("assistant", "Done."), ("user", DEFAULT_COMPACTION_INSTRUCTION)]


async def test_the_openai_sdk_reads_the_v1_compact_reply(client: openai.AsyncOpenAI, fake: FakeParse) -> None:
    fake.script = summary_turn()
    compacted = await client.responses.compact(model="demo", input=CONVERSATION[1:], instructions="base prompt")
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "compaction"]
    assert compacted.usage.input_tokens_details.cached_tokens == 880


async def test_real_codex_compaction_requests_reuse_the_turn_before(gateway: Gateway, fake: FakeParse) -> None:
    """Codex 0.171.0's recorded requests: a turn, its local compaction (tools: []), its remote compaction."""
    capture = json.loads((CAPTURES / "codex_0.171.0_compaction_requests.json").read_text())["requests"]
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http:
        for recorded in capture:
            headers = {k: v for k, v in recorded["headers"].items() if k.lower() not in _DROP_HEADERS}
            fake.script = summary_turn()
            reply = await http.post("/v1/responses", json={**recorded["body"], "model": "demo"}, headers=headers)
            assert reply.status_code == 200, reply.text
    turn, local, remote = fake.requests[-3:]
    assert turn.tools and list(local.tools) == list(turn.tools)  # sent with tools: [], rendered with them
    assert list(local.messages)[:len(turn.messages)] == list(turn.messages)
    assert list(remote.tools) == list(turn.tools)  # (another session of the same Codex and config)
    assert text_of(remote.messages[-1]) == DEFAULT_COMPACTION_INSTRUCTION
    assert "CONTEXT CHECKPOINT COMPACTION" in text_of(local.messages[-1])  # Codex's own prompt, kept as sent
    output = [e["item"] for e in sse_events(reply.text) if e["type"] == "response.output_item.done"]
    assert [item["type"] for item in output] == ["compaction"]
