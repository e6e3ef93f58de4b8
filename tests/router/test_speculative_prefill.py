"""Speculative prefill: the parse service's predicted next-turn prefix is the next turn's prompt prefix."""

from __future__ import annotations

from services.api import chat_pb2, common_pb2
from services.common import token_bytes
from services.common.model_dir import load_model_dir
from services.parse import convert
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import TextDelta
from services.parse.speculative import TurnRecorder, next_turn_request


def message(role: str, text: str) -> chat_pb2.Message:
    return chat_pb2.Message(role=role, parts=[chat_pb2.Part(text=text)])


def test_predicted_prefix_is_a_prefix_of_the_next_turn() -> None:
    fmt = ModelFormat(load_model_dir(""))
    turn1 = chat_pb2.ChatRequest(messages=[message("user", "hello there")],
                                 hints=common_pb2.AgentHints(speculative_prefill=True, priority=2))
    recorder = TurnRecorder()
    recorder.observe([TextDelta("Hi! How "), TextDelta("can I help?")])
    spec = next_turn_request(fmt, turn1, recorder, request_id="r1", worker_id="w7")
    assert spec.prefill_only and spec.target_worker_id == "w7" and spec.hints.priority < 0
    assert not spec.hints.speculative_prefill
    turn2 = chat_pb2.ChatRequest(messages=[message("user", "hello there"), message("assistant", "Hi! How can I help?"),
                                           message("user", "what's the weather?")])
    next_prompt = fmt.build_prompt(convert.conversation_from_proto(turn2)).token_ids
    sent = token_bytes.unpack(spec.token_ids_u32)
    assert next_prompt[: len(sent)] == sent
