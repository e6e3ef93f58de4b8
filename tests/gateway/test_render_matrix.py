"""Render matrix: every template family x every conversation (and kwargs variant) x every API -> the prompt's
token ids are those of Hugging Face's rendering of the equivalent OpenAI-form conversation.

Each cell writes the request a client of the API sends (``api_forms.py``, the mapping of
docs/conversation-mapping.md) as JSON, validates it with the API's own models and converts it with the
API's own ``convert.py`` to the canonical ``ChatRequest``, which crosses the wire (serialized and parsed
again) to the parse service's path for a prompt: request limits, ``convert.conversation_from_proto``,
``ModelFormat.build_prompt`` over a model directory loaded by ``load_model_dir`` (the family's template and
a tokenizer with its control strings as added tokens). The expected ids: Hugging Face's
``apply_chat_template(tokenize=False)`` of the equivalent OpenAI-form conversation, tokenized by
``tokenizers``; for the OpenAI chat and gRPC forms that conversation is the recorded one, and
``test_the_oracle_is_the_recorded_reference`` holds the live rendering to the recorded reference. Where
the template refuses the conversation, the API answers 400 (gRPC: INVALID_ARGUMENT) with its message.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

from gateway.apis.anthropic import convert as anthropic_convert
from gateway.apis.anthropic import errors as anthropic_errors
from gateway.apis.anthropic.models import MessagesRequest
from gateway.apis.openai_chat import convert as chat_convert
from gateway.apis.openai_chat import errors as openai_errors
from gateway.apis.openai_chat.models import ChatCompletionRequest
from gateway.apis.responses import convert as responses_convert
from gateway.apis.responses.models import ResponsesRequest
from gateway.boundary import public_error
from services.api import chat_pb2
from services.common import errors
from services.common.model_dir import DEMO_MODEL_DIR, load_model_dir
from services.parse.convert import conversation_from_proto
from services.parse.limits import RequestLimits
from services.parse.model_format import ModelFormat
from tests.gateway import api_forms
from tests.parse.support import FIXED_NOW, TEMPLATE_FIXTURES

DOC = Path(__file__).resolve().parents[2] / "docs" / "conversation-mapping.md"
Expected = list[int] | str  # token ids, or the template's error message


def _json(name: str) -> Any:
    return json.loads((TEMPLATE_FIXTURES / name).read_text(encoding="utf-8"))


CONVERSATIONS = {c["id"]: c for c in _json("conversations.json")["conversations"]}
FAMILIES = sorted(_json("manifest.json")["families"])


def _meta(family: str) -> dict[str, Any]:
    meta: dict[str, Any] = _json(f"{family}/reference/meta.json")
    return meta


@functools.cache
def _tokenizer_json(family: str) -> str:
    """The demo tokenizer plus the family's control strings and named tokens as added special tokens."""
    special = _json(f"{family}/special_tokens.json")
    variables = _meta(family)["renders"][0]["template_variables_from_special_tokens"]
    tokenizer = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    controls = dict.fromkeys([*special.get("control_strings_in_template", []), *variables.values()])
    tokenizer.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in controls])
    return tokenizer.to_str()


@functools.cache
def _tokenizer(family: str) -> Tokenizer:
    return Tokenizer.from_str(_tokenizer_json(family))


@functools.cache
def _hf_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A transformers tokenizer with the family's template and named tokens (as make_references.py built it)."""
    template = (TEMPLATE_FIXTURES / family / "chat_template.jinja").read_bytes().decode("utf-8")
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(family)),
        chat_template=template,
        **_meta(family)["renders"][0]["template_variables_from_special_tokens"],
    )


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModelFormat]]:
    """One model directory per family (template in tokenizer_config.json, byte for byte) and its ModelFormat."""
    out: dict[str, ModelFormat] = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        template = (TEMPLATE_FIXTURES / family / "chat_template.jinja").read_bytes().decode("utf-8")
        variables = _meta(family)["renders"][0]["template_variables_from_special_tokens"]
        (root / "tokenizer.json").write_text(_tokenizer_json(family), encoding="utf-8")
        (root / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": template, **variables}), encoding="utf-8"
        )
        out[family] = ModelFormat(load_model_dir(root), now=lambda: FIXED_NOW)
    yield out


class _FixedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> _FixedDatetime:  # type: ignore[override]
        return (
            cls.fromisoformat(FIXED_NOW.isoformat())
            if tz is None
            else cls.fromisoformat(FIXED_NOW.replace(tzinfo=tz).isoformat())
        )


@contextmanager
def _hugging_face_clock() -> Iterator[None]:
    """transformers' own ``strftime_now`` on the fixed date (as the references were made). It reads the module's
    ``datetime`` at each call; our renderer compiles its own templates, so no compiled template is shared."""
    saved = chat_template_utils.datetime  # type: ignore[attr-defined]
    chat_template_utils.datetime = _FixedDatetime  # type: ignore[attr-defined,misc]
    try:
        yield
    finally:
        chat_template_utils.datetime = saved  # type: ignore[attr-defined]


@functools.cache
def _hugging_face(family: str, conversation_json: str, kwargs_json: str) -> str:
    """``apply_chat_template(tokenize=False)`` as make_references.py called it; an error as "error: <message>"."""
    conversation = json.loads(conversation_json)
    record = _meta(family)["renders"][0]
    messages = conversation["messages"]
    if record["tool_call_arguments"] == "json_string":  # the template concatenates them (DeepSeek)
        for m in messages:
            for call in m.get("tool_calls") or []:
                call["function"]["arguments"] = api_forms._arguments(call)
    tok = _hf_tokenizer(family)
    extra: dict[str, Any] = json.loads(kwargs_json)
    if conversation.get("tools") is not None:
        extra["tools"] = conversation["tools"]
    prompt = {
        "add_generation_prompt": conversation.get("add_generation_prompt", True),
        "continue_final_message": conversation.get("continue_final_message", False),
    }
    with _hugging_face_clock():
        try:
            text = tok.apply_chat_template(messages, tokenize=False, **prompt, **extra)
        except Exception as exc:  # the template's error is the expected answer
            return f"error: {exc}"
    return str(text)


def expected(family: str, conversation: api_forms.Conversation, kwargs: dict[str, Any]) -> Expected:
    text = _hugging_face(family, json.dumps(conversation), json.dumps(kwargs))
    if text.startswith("error: "):
        return text.removeprefix("error: ")
    return list(_tokenizer(family).encode(text, add_special_tokens=False).ids)


def canonical(api: str, conversation: api_forms.Conversation, kwargs: dict[str, Any]) -> chat_pb2.ChatRequest | None:
    """The client's request through the API's models and conversion (None: the kwargs cannot be said there)."""
    if api == "openai_chat":
        chat = ChatCompletionRequest.model_validate_json(json.dumps(api_forms.openai_chat(conversation, kwargs)))
        return chat_convert.chat_request(chat, {}, model="m", request_id="chatcmpl-1")
    if api == "anthropic":
        body = api_forms.anthropic(conversation, kwargs)
        if body is None:
            return None
        messages = MessagesRequest.model_validate_json(json.dumps(body))
        return anthropic_convert.chat_request(messages, {}, model="m", request_id="msg_1", strip=True)
    if api == "responses":
        raw = api_forms.responses(conversation, kwargs)
        if raw is None:
            return None
        raw = json.loads(json.dumps(raw))
        return responses_convert.chat_request(
            ResponsesRequest.model_validate(raw), {}, (), model="m", request_id="resp_1"
        ).chat
    return chat_pb2.ChatRequest.FromString(api_forms.grpc_edge(conversation, kwargs).SerializeToString())


def prompt_ids(fmt: ModelFormat, request: chat_pb2.ChatRequest) -> list[int] | errors.MeshError:
    """The parse service's prompt for the request after the hop (what ``Tokenize`` and ``Chat`` build)."""
    wire = chat_pb2.ChatRequest.FromString(request.SerializeToString())
    try:
        RequestLimits().check(wire)
        return list(fmt.build_prompt(conversation_from_proto(wire)).token_ids)
    except errors.MeshError as exc:
        # Back across the hop (code + message), then the gateway's boundary.
        return public_error(errors.from_proto(errors.to_proto(exc)), "req_1")


def _answer(api: str, error: errors.MeshError) -> tuple[int | grpc.StatusCode, str]:
    """The API's reply to ``error``: HTTP status and message, or the gRPC status and details."""
    if api == "grpc_edge":
        return error.grpc_status, error.message
    response = (
        anthropic_errors.error_response(error, "req_1") if api == "anthropic" else openai_errors.error_response(error)
    )
    return response.status_code, json.loads(bytes(response.body))["error"]["message"]


def _cells() -> list[Any]:
    return [
        pytest.param(family, record, api, id=f"{family}-{record['conversation']}-{record['variant']}-{api}")
        for family in FAMILIES
        for record in _meta(family)["renders"]
        for api in api_forms.API_NAMES
    ]


@pytest.mark.parametrize(("family", "record", "api"), _cells())
def test_render_matrix(formats: dict[str, ModelFormat], family: str, record: dict[str, Any], api: str) -> None:
    conversation = CONVERSATIONS[record["conversation"]]
    request = canonical(api, conversation, record["kwargs"])
    if request is None:
        pytest.skip(f"{api} cannot set the template kwargs {record['kwargs']}")
    want = expected(family, api_forms.equivalent(api, conversation), record["kwargs"])
    got = prompt_ids(formats[family], request)
    if isinstance(want, str):
        assert isinstance(got, errors.MeshError), f"the template refuses this conversation: {want}"
        bad = grpc.StatusCode.INVALID_ARGUMENT if api == "grpc_edge" else 400
        assert _answer(api, got) == (bad, want)
        return
    assert not isinstance(got, errors.MeshError), got.message
    assert got == want


@pytest.mark.parametrize("family", FAMILIES)
def test_the_oracle_is_the_recorded_reference(family: str) -> None:
    """Live Hugging Face renders of the recorded conversations are the recorded references (and errors)."""
    for record in _meta(family)["renders"]:
        text = _hugging_face(family, json.dumps(CONVERSATIONS[record["conversation"]]), json.dumps(record["kwargs"]))
        if record["status"] == "error":
            assert text == f"error: {record['error']}"
        else:
            path = TEMPLATE_FIXTURES / family / "reference" / record["file"]
            assert text == path.read_bytes().decode("utf-8"), record["file"]


def test_the_mapping_document_and_the_test_name_the_same_rules() -> None:
    import re

    assert set(re.findall(r"\*\*\[([a-z_]+\.[a-z_]+)\]\*\*", DOC.read_text(encoding="utf-8"))) == api_forms.RULES
