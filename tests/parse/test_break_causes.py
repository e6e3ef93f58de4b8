"""Every prefix break is explained (issue 34): scripted two-turn sessions with one cause injected each, rendered
with the demo model's real chat template and watched as the parse service watches them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.parse.break_cause import CAUSES, Cause, TurnShape, explain
from services.parse.conversation import ChatMessage, Conversation, ReasoningPart, TextPart, ToolCallPart, ToolSpec
from services.parse.model_format import ModelFormat
from services.parse.prefix_watch import PrefixBreak, PrefixWatch
from tests.parse.test_service import DEMO

FMT = ModelFormat(DEMO, reasoning_parser="qwen3", tool_parser="hermes", max_model_len=16384)
BILLING = "x-anthropic-billing-header: cc_version=2.1.330; cch={};\n"
TOOL = ToolSpec("get_weather", "Weather", '{"type": "object", "properties": {"city": {"type": "string"}}}')


def msg(role: str, *parts: str | ReasoningPart | ToolCallPart) -> ChatMessage:
    return ChatMessage(role, tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


BRIEF = "You are a coding agent. Be brief."
SYSTEM = msg("system", BILLING.format(1) + BRIEF)
FIRST = Conversation((SYSTEM, msg("user", "List the files."), msg("assistant", "Which folder?"),
                      msg("user", "The src folder, please.")), tools=(TOOL,), strip_billing_header=False)
ANSWER = msg("assistant", ReasoningPart("The user wants src."), "Calling ls.")
NEXT = msg("user", "Thanks. Now count them.")


def hoisted(conversation: Conversation) -> Conversation:
    """As a template that moves inline system messages into the first system block renders it."""
    inline = [m for i, m in enumerate(conversation.messages) if i and m.role == "system"]
    first, *rest = (m for i, m in enumerate(conversation.messages) if not (i and m.role == "system"))
    joined = msg("system", "\n".join(p.text for m in (first, *inline) for p in m.parts if isinstance(p, TextPart)))
    return replace(conversation, messages=(joined, *rest))


def watched(first: Conversation, second: Conversation, *, answer: ChatMessage = ANSWER,
            salts: tuple[str, str] = ("", ""), render: bool = False) -> PrefixBreak | None:
    """Turn one (``first``, the model answering ``answer``), then ``second``: the break reported, if any.
    ``render``: as a template that hoists inline system messages renders them."""
    watch = PrefixWatch(FMT.decode)
    shown = hoisted if render else (lambda c: c)
    prompt = FMT.build_prompt(shown(first)).token_ids
    turn = watch.begin("s", prompt, shape=TurnShape(first.messages, first.tools, salts[0]))
    assert turn is not None
    # what the model generated: the template's rendering of the answer, up to its end-of-turn token
    whole = FMT.build_prompt(replace(shown(first), messages=(*shown(first).messages, answer),
                                     add_generation_prompt=False)).token_ids
    assert list(whole[:len(prompt)]) == list(prompt)
    generated = list(whole[len(prompt):])
    end = next(i for i, t in enumerate(generated) if t in FMT.stop_token_ids)
    turn.extend(generated[:end + 1])
    turn.commit(answer)
    watch.begin("s", FMT.build_prompt(shown(second)).token_ids,
                shape=TurnShape(second.messages, second.tools, salts[1]))
    return watch.breaks[-1] if watch.breaks else None


def then(first: Conversation, *, sent_back: ChatMessage = ANSWER, **changes: object) -> Conversation:
    """The next turn as a harness sends it: ``first``, the answer as ``sent_back``, a new user message."""
    return replace(first, messages=(*first.messages, sent_back, NEXT), **changes)  # type: ignore[arg-type]


def edited(conversation: Conversation, index: int, message: ChatMessage) -> Conversation:
    messages = list(conversation.messages)
    messages[index] = message
    return replace(conversation, messages=tuple(messages))


def injected() -> dict[str, tuple[PrefixBreak | None, Cause]]:
    """One session per cause: (the break the watch reported, the cause injected)."""
    plain = replace(FIRST, messages=(msg("system", "You are a coding agent."), *FIRST.messages[1:]))
    tool_answer = msg("assistant", "Calling ls.", ToolCallPart("call_1", "get_weather", '{"city": "Paris"}'))
    no_reasoning = msg("assistant", "Calling ls.")
    inline = replace(plain, messages=(*plain.messages, ANSWER, msg("system", "The user prefers short answers."),
                                      NEXT))
    return {
        "billing_line": (watched(FIRST, edited(then(FIRST), 0, msg("system", BILLING.format(2) + BRIEF))),
                         Cause("billing_line", 0, "system")),
        "system_changed": (watched(FIRST, edited(then(FIRST), 0, msg("system", BILLING.format(1) + "Be verbose."))),
                           Cause("system_changed", 0, "system")),
        "tools_changed": (watched(FIRST, then(FIRST, tools=(replace(TOOL, description="Forecast"),))),
                          Cause("tools_changed")),
        "message_edited": (watched(FIRST, edited(then(FIRST), 1, msg("user", "List the tests."))),
                           Cause("message_edited", 1, "user")),
        "history_rewritten": (watched(FIRST, replace(FIRST, messages=(SYSTEM, msg("user", "Summary: user wants src."),
                                                                      ANSWER, NEXT))),
                              Cause("history_rewritten", 1, "user")),
        "output_rewritten": (watched(FIRST, then(FIRST, sent_back=msg("assistant", ReasoningPart("The user wants src."),
                                                                      "Calling ls -la."))),
                             Cause("output_rewritten", 4, "assistant")),
        "reasoning_dropped": (watched(FIRST, then(FIRST, sent_back=no_reasoning)),
                              Cause("reasoning_dropped", 4, "assistant")),
        "cache_salt": (watched(FIRST, then(FIRST), salts=("", "tenant-b")), Cause("cache_salt")),
        "inline_system_moved": (watched(plain, inline, render=True), Cause("inline_system_moved", 5, "system")),
        "no_break": (watched(FIRST, then(FIRST, sent_back=tool_answer), answer=tool_answer), Cause("none")),
    }


INJECTED = injected()


@pytest.mark.parametrize("cause", sorted(INJECTED))
def test_each_injected_cause_is_named(cause: str) -> None:
    report, expected = INJECTED[cause]
    if expected.cause == "none":
        assert report is None
        return
    assert report is not None, cause
    assert (report.cause, report.message_index, report.message_role) == (expected.cause, expected.index,
                                                                          expected.role)


def test_every_cause_has_a_case_and_the_names_are_the_issues() -> None:
    assert set(CAUSES) - {"unknown"} == set(INJECTED) - {"no_break"}


def test_an_inline_system_message_that_the_rendering_moved_is_named_from_the_conversations() -> None:
    before = TurnShape((msg("system", "S"), msg("user", "a")))
    after = TurnShape((msg("system", "S"), msg("user", "a"), msg("assistant", "b"), msg("system", "new rule"),
                       msg("user", "c")))
    assert explain(before, msg("assistant", "b"), after) == Cause("inline_system_moved", 3, "system")


def test_a_history_with_no_shape_is_unknown_and_a_template_that_drops_reasoning_is_named() -> None:
    assert explain(None, None, TurnShape(())).cause == "unknown"
    shape = TurnShape((msg("user", "a"),))
    reasoned = msg("assistant", ReasoningPart("r"), "b")
    assert explain(shape, reasoned, TurnShape((msg("user", "a"), reasoned, msg("user", "c")))) == Cause(
        "reasoning_dropped", 1, "assistant")
