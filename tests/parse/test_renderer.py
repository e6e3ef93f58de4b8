"""The renderer and the conversation translation, on the demo model."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime

import pytest

from services.common.errors import InvalidRequestError
from services.common.model_dir import load_model_dir
from services.parse.conversation import (
    ChatMessage,
    Conversation,
    MessageDicts,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolSpec,
    match_text,
    strip_billing_header,
    to_template_input,
)
from services.parse.json_memo import MEMO
from services.parse.model_format import ModelFormat
from services.parse.renderer import ChatTemplateRenderer
from services.parse.replay import ReplayPolicy

WEATHER = ToolSpec("get_weather", "Weather of a city", '{"type": "object", "properties": {"city": {"type": "string"}}}')


def agent_conversation(system: str = "You are helpful.") -> Conversation:
    return Conversation(
        messages=(
            ChatMessage("system", (TextPart(system),)),
            ChatMessage("user", (TextPart("Weather in Paris and Lyon?"),)),
            ChatMessage("assistant", (
                ReasoningPart("Paris first."),
                ToolCallPart("call_1", "get_weather", '{"city": "Paris"}'),
                ReasoningPart("Now Lyon."),
                ToolCallPart("call_2", "get_weather", '{"city": "Lyon"}'),
            )),
            ChatMessage("tool", (TextPart("18C"),), tool_call_id="call_1", name="get_weather"),
            ChatMessage("tool", (TextPart("20C"),), tool_call_id="call_2", name="get_weather"),
        ),
        tools=(WEATHER,),
    )


@pytest.fixture(scope="module")
def demo() -> ModelFormat:
    return ModelFormat(load_model_dir(None))


def test_demo_template_replays_interleaved_reasoning_and_tool_calls(demo: ModelFormat) -> None:
    text = demo.render(agent_conversation())
    assert text.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city"' in text
    tail = text[text.index("<|im_start|>user\nWeather"):]
    assert tail == (
        "<|im_start|>user\nWeather in Paris and Lyon?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\nParis first.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<think>\nNow Lyon.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n20C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_enable_thinking_false_prefills_empty_think(demo: ModelFormat) -> None:
    conv = Conversation(messages=(ChatMessage("user", (TextPart("hi"),)),),
                        template_kwargs_json='{"enable_thinking": false}')
    assert demo.render(conv).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_template_input_shape() -> None:
    data = to_template_input(agent_conversation())
    assistant = data.messages[2]
    assert assistant["role"] == "assistant"
    assert "content" not in assistant  # None-valued keys are dropped, as transformers does
    assert assistant["reasoning_content"] == "Paris first.\nNow Lyon."
    assert assistant["tool_calls"][0] == {
        "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert [s["type"] for s in assistant["segments"]] == ["reasoning", "tool_call", "reasoning", "tool_call"]
    assert data.messages[3] == {"role": "tool", "content": "18C", "tool_call_id": "call_1", "name": "get_weather"}
    assert data.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    assert match_text(agent_conversation()) == "18C\x1e20C"


def test_match_text_is_every_user_and_tool_message_since_the_last_assistant() -> None:
    """OpenClaw appends its own user message after the tool results: the script must still see them."""
    openclaw = dataclasses.replace(agent_conversation(), messages=(
        *agent_conversation().messages, ChatMessage("user", (TextPart("[runtime context] cwd=/w"),))))
    assert match_text(openclaw) == "18C\x1e20C\x1e[runtime context] cwd=/w"
    assert "Weather in Paris" not in match_text(openclaw)          # the turn before the assistant's is done
    prefill = dataclasses.replace(openclaw, messages=(*openclaw.messages, ChatMessage("assistant", (TextPart("Ok"),))))
    assert match_text(prefill) == match_text(openclaw)              # a trailing assistant prefill is skipped
    first = Conversation(messages=(ChatMessage("system", (TextPart("s"),)), ChatMessage("user", (TextPart("hi"),))))
    assert match_text(first) == "hi"


def test_unparseable_arguments_stay_text() -> None:
    conv = Conversation(messages=(ChatMessage("assistant", (ToolCallPart("c", "f", "{not json"),)),))
    assert to_template_input(conv).messages[0]["tool_calls"][0]["function"]["arguments"] == "{not json"


@pytest.mark.parametrize(("conv", "param"), [
    (Conversation(messages=()), "messages"),
    (Conversation(messages=(ChatMessage("user", (TextPart("x"),)),), template_kwargs_json="{"),
     "chat_template_kwargs_json"),
    (Conversation(messages=(ChatMessage("user", (TextPart("x"),)),), template_kwargs_json="[1]"),
     "chat_template_kwargs_json"),
    (Conversation(messages=(ChatMessage("user", (TextPart("x"),)),), tools=(ToolSpec("f", "", "{bad"),)),
     "tools[0].parameters_json"),
])
def test_bad_input_names_the_field(conv: Conversation, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        to_template_input(conv)
    assert info.value.param == param


def test_billing_header_is_stripped_so_prefixes_are_stable(demo: ModelFormat) -> None:
    a = "x-anthropic-billing-header: cc_version=2.0.1; cc_entrypoint=cli; cch=aaaa;\nYou are Claude Code."
    b = "x-anthropic-billing-header: cc_version=2.0.1; cc_entrypoint=cli; cch=bbbb;\nYou are Claude Code."
    assert demo.render(agent_conversation(a)) == demo.render(agent_conversation(b))
    assert "billing" not in demo.render(agent_conversation(a))
    assert strip_billing_header("keep\nx-anthropic-billing-header: x\nme") == "keep\nme"
    kept = ModelFormat(load_model_dir(None), strip_billing_header=False)
    assert "x-anthropic-billing-header" in kept.render(agent_conversation(a))


def test_raise_exception_becomes_invalid_request() -> None:
    renderer = ChatTemplateRenderer("{{ raise_exception('no system role here') }}", {})
    conv = Conversation(messages=(ChatMessage("user", (TextPart("x"),)),))
    with pytest.raises(InvalidRequestError, match=r"^no system role here$"):
        renderer.render(to_template_input(conv))


def test_template_clock_is_per_renderer() -> None:
    template = "{{ strftime_now('%Y-%m-%d %H:%M') }}"
    data = to_template_input(Conversation(messages=(ChatMessage("user", (TextPart("x"),)),)))
    a = ChatTemplateRenderer(template, {}, now=lambda: datetime(2026, 1, 15, 9, 30))
    b = ChatTemplateRenderer(template, {}, now=lambda: datetime(2001, 2, 3, 4, 5))
    assert a.render(data) == "2026-01-15 09:30"
    assert b.render(data) == "2001-02-03 04:05"
    assert a.render(data) == "2026-01-15 09:30"


def test_special_tokens_are_template_variables() -> None:
    renderer = ChatTemplateRenderer("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                                    {"bos_token": "<s>", "eos_token": "</s>"})
    data = to_template_input(Conversation(messages=(ChatMessage("user", (TextPart("x"),)),)))
    assert renderer.render(data) == "<s>x</s>"


def test_tokens_equal_encoding_the_rendered_text(demo: ModelFormat) -> None:
    prompt = demo.build_prompt(agent_conversation())
    tokenizer = demo.model_dir.tokenizer
    assert list(prompt.token_ids) == tokenizer.encode(prompt.text, add_special_tokens=False).ids
    assert prompt.text == demo.render(agent_conversation())
    assert demo.decode(prompt.token_ids) == prompt.text


def test_add_generation_prompt_unset_true_or_explicitly_false() -> None:
    from services.api import chat_pb2
    from services.parse.convert import conversation_from_proto

    messages = [chat_pb2.Message(role="user", parts=[chat_pb2.Part(text="hi")])]
    assert conversation_from_proto(chat_pb2.ChatRequest(messages=messages)).add_generation_prompt
    explicit = chat_pb2.ChatRequest(messages=messages, add_generation_prompt=False)
    assert not conversation_from_proto(explicit).add_generation_prompt
    continuing = chat_pb2.ChatRequest(messages=messages, continue_final_message=True)
    assert not conversation_from_proto(continuing).add_generation_prompt


def test_max_tokens_is_clamped_to_the_room_left(demo: ModelFormat) -> None:
    from services.common.errors import ContextLengthError

    limit = demo.max_model_len
    assert demo.fit_max_tokens(100, 32000) == min(32000, limit - 100)
    assert demo.fit_max_tokens(100, 10) == 10
    assert demo.fit_max_tokens(100, 0) == 0  # engine default
    with pytest.raises(ContextLengthError, match="prompt is too long"):
        demo.fit_max_tokens(limit, 1)


def test_a_render_past_its_budget_stops_with_a_400_naming_it() -> None:
    """A conversation whose render outlasts ``--render-budget-ms`` is stopped inside the template (not left to
    run on) and refused naming the budget; the same renderer then renders a normal conversation as before.
    The template does most of its work per message (as a hostile one would), so that transformers' own
    preparation of the messages, which no budget interrupts, is a small part of the whole."""
    template = "{% for m in messages %}{% for _ in range(200) %}{{ m['content'] | upper }}{% endfor %}{% endfor %}"
    many = Conversation(messages=tuple(ChatMessage("user", (TextPart(f"m{i}"),)) for i in range(2_000)))
    data = to_template_input(many)
    unbounded = ChatTemplateRenderer(template, {})
    started = time.thread_time()  # CPU time: a busy machine slows both renders, not this comparison
    unbounded.render(data)
    full = time.thread_time() - started
    budget = ChatTemplateRenderer(template, {}, budget=full / 20)
    started = time.thread_time()
    with pytest.raises(InvalidRequestError, match="render budget") as info:
        budget.render(data)
    assert time.thread_time() - started < full / 2  # stopped early, not rendered to the end
    assert info.value.http_status == 400 and info.value.param == "messages"
    small = to_template_input(agent_conversation())
    assert budget.render(small) == unbounded.render(small)


def test_kept_message_dicts_follow_how_a_later_turn_replays_an_earlier_message() -> None:
    """The same assistant message is replayed with its reasoning while it is the last turn and without it once
    a user message follows (``truncate_history_thinking``): a kept dict is reused only when made the same way."""
    policy = ReplayPolicy(mode="reinsert")
    assistant = ChatMessage("assistant", (ReasoningPart("Think first."), TextPart("Done.")))
    first = Conversation(messages=(ChatMessage("user", (TextPart("Go."),)), assistant),
                         template_kwargs_json='{"truncate_history_thinking": true}')
    second = dataclasses.replace(first, messages=(*first.messages, ChatMessage("user", (TextPart("Again."),))))
    memo = MessageDicts()
    for turn in (first, second, first):
        assert to_template_input(turn, replay=policy, memo=memo).messages == \
            to_template_input(turn, replay=policy).messages
    assert "Think first." in str(to_template_input(first, replay=policy, memo=memo).messages[1])
    assert "Think first." not in str(to_template_input(second, replay=policy, memo=memo).messages[1])


def test_kept_tool_call_arguments_are_encoded_once_and_forgotten_with_their_message() -> None:
    """A kept message's tool-call arguments are registered with the ``tojson`` memo, so the next turn's render
    reads their JSON instead of encoding it again (a 100k-token agent session re-encoded ~170 calls a turn);
    the render equals one without any memo, and a message the bounded memo drops takes its registration along."""
    call = ChatMessage("assistant", (ToolCallPart("call_1", "read", '{"path": "a.py", "n": [1, 2]}'),))
    turn = Conversation(messages=(ChatMessage("user", (TextPart("Go."),)), call,
                                  ChatMessage("tool", (TextPart("print(1)"),), tool_call_id="call_1")))
    memo = MessageDicts(max_messages=3)
    made = to_template_input(turn, memo=memo).messages[1]
    kept = made["tool_calls"][0]["function"]["arguments"]
    in_segment = made["segments"][0]["arguments"]  # the demo template's ordered segments carry their own
    encodings: list[object] = []
    for arguments in (kept, in_segment):
        assert MEMO.encoded(arguments, (), {}, lambda: encodings.append(1) or "first") == "first"
        assert MEMO.encoded(arguments, (), {}, lambda: encodings.append(2) or "again") == "first"  # not again
    assert encodings == [1, 1]
    renderer = ModelFormat(load_model_dir(None), reasoning_parser="qwen3", tool_parser="hermes")
    assert renderer.render(turn) == ModelFormat(load_model_dir(None), reasoning_parser="qwen3",
                                                tool_parser="hermes").render(turn)
    for i in range(3):  # three other messages push the call's dict out of the memo
        to_template_input(Conversation(messages=(ChatMessage("user", (TextPart(f"other {i}"),)),)), memo=memo)
    assert MEMO.encoded(kept, (), {}, lambda: "encoded afresh") == "encoded afresh"
    assert MEMO.encoded(in_segment, (), {}, lambda: "encoded afresh") == "encoded afresh"
