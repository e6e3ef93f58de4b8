"""Incremental prompt tokenization (``prompt_cache.py``): always exactly the ids of a full tokenization.

Property tests over every template family the repo ships (the demo model's and the references in
tests/fixtures/chat_templates), each with a tokenizer that has the family's control strings as added
tokens: hypothesis-generated agent conversations grown turn by turn, with history rewrites
(compaction, a changed system prompt, a billing line, an edited earlier message, changed tools or
template kwargs) at random turns, and random text edits at random points of a rendered prompt.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer

from services.common.errors import InvalidRequestError
from services.common.model_dir import DEMO_MODEL_DIR, load_model_dir, load_prompt_encoder
from services.common.sequences import common_prefix
from services.parse.conversation import (
    ChatMessage,
    Conversation,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolSpec,
    to_template_input,
)
from services.parse.model_format import ModelFormat
from services.parse.prompt_cache import PromptCache, boundary_tokens
from services.parse.renderer import ChatTemplateRenderer
from tests.parse.support import FIXED_NOW, TEMPLATE_FIXTURES


@dataclass(frozen=True)
class FamilyKit:
    """A template family: its renderer, kwargs variants and a tokenizer with its control strings."""

    name: str
    renderer: ChatTemplateRenderer
    variants: tuple[dict[str, Any], ...]
    reference: Tokenizer
    encode: Any  # the prompt encoder's encode (fastokens where it agrees)

    def full(self, text: str) -> list[int]:
        return list(self.reference.encode(text, add_special_tokens=False).ids)

    def cache(self) -> PromptCache:
        return PromptCache(self.encode, boundary_tokens(self.reference, self.encode))

    def render(self, conversation: Conversation, strip: bool = True) -> str | None:
        try:
            return self.renderer.render(to_template_input(
                conversation, strip_billing=strip, arguments_as_text=self.renderer.arguments_as_text))
        except InvalidRequestError:
            return None  # this template refuses the conversation (roles out of order, content and thinking...)


def _family_names() -> list[str]:
    names = ["demo"]
    if (TEMPLATE_FIXTURES / "manifest.json").is_file():
        names += sorted(json.loads((TEMPLATE_FIXTURES / "manifest.json").read_text(encoding="utf-8"))["families"])
    return names


@functools.cache
def kit(name: str) -> FamilyKit:
    demo = load_model_dir("")
    if name == "demo":
        return FamilyKit("demo", ChatTemplateRenderer(demo.chat_template, demo.special_tokens, now=lambda: FIXED_NOW),
                         ({}, {"enable_thinking": False}), demo.tokenizer, demo.encoder.encode)
    fam = TEMPLATE_FIXTURES / name
    meta = json.loads((fam / "reference" / "meta.json").read_text(encoding="utf-8"))
    special = json.loads((fam / "special_tokens.json").read_text(encoding="utf-8"))
    variables = meta["renders"][0]["template_variables_from_special_tokens"]
    tokenizer = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    controls = [*special.get("control_strings_in_template", []), *variables.values()]
    tokenizer.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in dict.fromkeys(controls)])
    encoder = load_prompt_encoder(tokenizer.to_str(), tokenizer, source=name)
    renderer = ChatTemplateRenderer((fam / "chat_template.jinja").read_text(encoding="utf-8"), variables,
                                    now=lambda: FIXED_NOW)
    variants = tuple({json.dumps(r["kwargs"], sort_keys=True): r["kwargs"] for r in meta["renders"]}.values())
    return FamilyKit(name, renderer, variants, tokenizer, encoder.encode)


FAMILIES = _family_names()

# Text from pieces that stress tokenization at edges: whitespace runs, non-ASCII, digits, markers and
# halves of markers as plain text, a billing header line.
FRAGMENTS = ("the", " quick", " fox", "  ", "\n", "\n\n", " \n", "\t", "é", "日本語", "😀", "123", "4.5", "{", '"',
             "}", "<", "|", ">", "<|", "|>", "<think>", "</think>", "<|im_end|>", "<tool_call>", "[INST]", "▁", "'s",
             "x-anthropic-billing-header: cc_version=2.1; cch=ab12;\n")
texts = st.lists(st.sampled_from(FRAGMENTS), min_size=0, max_size=12).map("".join)
words = st.lists(st.sampled_from(FRAGMENTS[:16]), min_size=1, max_size=8).map("".join)
TOOLS = tuple(ToolSpec(name, "A tool.", json.dumps({"type": "object", "properties": {arg: {"type": "string"}}}))
              for name, arg in (("Bash", "command"), ("Read", "path")))


@st.composite
def exchanges(draw: st.DrawFn, index: int) -> list[ChatMessage]:
    """One agent step: an assistant message (reasoning, text, tool calls) then its tool results, or a user turn."""
    parts: list[Part] = []
    if draw(st.booleans()):
        parts.append(ReasoningPart(draw(words)))
    parts.append(TextPart(draw(texts)))
    calls = [ToolCallPart(f"call_{index}_{i}", draw(st.sampled_from(("Bash", "Read"))),
                          json.dumps({"command": draw(words)}, ensure_ascii=False))
             for i in range(draw(st.integers(0, 2)))]
    out = [ChatMessage("assistant", (*parts, *calls))]
    out += [ChatMessage("tool", (TextPart(draw(texts)),), tool_call_id=c.id) for c in calls]
    if not calls or draw(st.booleans()):
        out.append(ChatMessage("user", (TextPart(draw(words)),)))
    return out


REWRITES = ("none", "none", "none", "system", "compaction", "billing", "edit", "tools", "kwargs", "strip")


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Conversation], list[bool]]:
    """A session's turns: each conversation extends the last, except where a rewrite changes history."""
    system = draw(st.one_of(st.none(), texts))
    messages: list[ChatMessage] = [ChatMessage("system", (TextPart(system),))] if system is not None else []
    messages.append(ChatMessage("user", (TextPart(draw(words)),)))
    tools = TOOLS if draw(st.booleans()) else ()
    kwargs: dict[str, Any] = {}
    strip = True
    turns: list[Conversation] = []
    strips: list[bool] = []
    for i in range(draw(st.integers(1, 6))):
        rewrite = draw(st.sampled_from(REWRITES)) if i else "none"
        if rewrite == "system":
            messages = [ChatMessage("system", (TextPart(draw(texts)),)), *messages[1 if system is not None else 0:]]
            system = ""
        elif rewrite == "compaction" and len(messages) > 2:
            summary = ChatMessage("user", (TextPart("Summary: " + draw(words)),))
            messages = [*messages[:1 if system is not None else 0], summary]
        elif rewrite == "billing" and system is not None:
            messages[0] = ChatMessage("system", (TextPart(
                f"x-anthropic-billing-header: cch={draw(st.integers(0, 999))};\n{system}"),))
        elif rewrite == "edit":
            at = draw(st.integers(0, len(messages) - 1))
            m = messages[at]
            messages[at] = replace(m, parts=(*m.parts, TextPart(draw(words))))
        elif rewrite == "tools":
            tools = () if tools else TOOLS
        elif rewrite == "kwargs":
            kwargs = {"enable_thinking": False} if not kwargs else {}
        elif rewrite == "strip":
            strip = not strip
        turns.append(Conversation(tuple(messages), tools, json.dumps(kwargs)))
        strips.append(strip)
        messages = [*messages, *draw(exchanges(i))]
    return turns, strips


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(session=sessions())
def test_incremental_ids_equal_full_ids(family: str, session: tuple[list[Conversation], list[bool]]) -> None:
    fam = kit(family)
    cache = fam.cache()
    turns, strips = session
    for conversation, strip in zip(turns, strips, strict=True):
        for kwargs in fam.variants[:1] if conversation.template_kwargs_json != "{}" else fam.variants:
            conv = conversation if not kwargs else replace(conversation, template_kwargs_json=json.dumps(kwargs))
            text = fam.render(conv, strip)
            if text is None:
                continue
            encoded = cache.encode(f"s{json.dumps(kwargs)}", text)
            assert list(encoded.token_ids) == fam.full(text)
            assert list(encoded.token_ids[:encoded.reused_tokens]) == fam.full(text)[:encoded.reused_tokens]


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_edit_points(family: str, data: st.DataObject) -> None:
    """Any text after any other: cut, insert or replace at random points of a rendered agent prompt."""
    fam = kit(family)
    text = _agent_render(fam)
    cache = fam.cache()
    assert list(cache.encode("k", text).token_ids) == fam.full(text)
    for _ in range(data.draw(st.integers(1, 5))):
        at = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(("append", "insert", "cut", "replace")))
        piece = data.draw(texts)
        if op == "append":
            text = text + piece
        elif op == "insert":
            text = text[:at] + piece + text[at:]
        elif op == "cut":
            text = text[:at]
        else:
            text = text[:at] + piece + text[at + data.draw(st.integers(0, 40)):]
        assert list(cache.encode("k", text).token_ids) == fam.full(text)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_new_chars_is_what_encode_tokenizes(family: str, data: st.DataObject) -> None:
    """``new_chars`` (the parse service decides by it where a prompt is tokenized) counts exactly the text the
    next ``encode`` gives the tokenizer: a new key's whole text, an edited prompt's text from the boundary on."""
    fam = kit(family)
    tokenized: list[int] = []

    def encode(text: str) -> Any:
        tokenized.append(len(text))
        return fam.encode(text)

    cache = PromptCache(encode, boundary_tokens(fam.reference, fam.encode))
    text = _agent_render(fam)
    for _ in range(data.draw(st.integers(1, 4))):
        expected = cache.new_chars("k", text)
        tokenized.clear()
        assert list(cache.encode("k", text).token_ids) == fam.full(text)
        assert sum(tokenized) == expected
        at = data.draw(st.integers(0, len(text)))
        text = data.draw(st.sampled_from((text + data.draw(texts), text[:at] + data.draw(texts) + text[at:])))
    assert cache.new_chars("", text) == len(text) == cache.new_chars("never seen", text)


def _agent_render(fam: FamilyKit) -> str:
    conversations = json.loads((TEMPLATE_FIXTURES / "conversations.json").read_text(encoding="utf-8")) \
        if TEMPLATE_FIXTURES.is_dir() else None
    from tests.parse.support import conversation_from_openai

    if conversations is not None:
        for conv_id in ("05_agent_loop_three_turns", "03_tool_call_reasoning", "02_system_user"):
            conv = next(c for c in conversations["conversations"] if c["id"] == conv_id)
            text = fam.render(conversation_from_openai(conv))
            if text is not None:
                return text
    return fam.render(Conversation((ChatMessage("user", (TextPart("hi"),)),))) or "hi"


@pytest.mark.parametrize("family", FAMILIES)
def test_agent_loop_turn_by_turn_reuses_the_previous_turn(family: str) -> None:
    """The reference agent conversation grown one message at a time: later turns are incremental builds,
    and their ids are the full build's."""
    if not TEMPLATE_FIXTURES.is_dir():
        pytest.skip(f"{TEMPLATE_FIXTURES} is absent")
    from tests.parse.support import conversation_from_openai

    fam = kit(family)
    conversations = json.loads((TEMPLATE_FIXTURES / "conversations.json").read_text(encoding="utf-8"))
    conv = conversation_from_openai(
        next(c for c in conversations["conversations"] if c["id"] == "05_agent_loop_three_turns"))
    cache = fam.cache()
    builds = []
    for n in range(1, len(conv.messages) + 1):
        if conv.messages[n - 1].role == "assistant":
            continue  # a turn ends with a user or tool message
        text = fam.render(replace(conv, messages=conv.messages[:n]))
        if text is None:
            continue
        encoded = cache.encode("session", text)
        assert list(encoded.token_ids) == fam.full(text)
        builds.append((encoded.build, encoded.reason, encoded.reused_tokens))
    assert builds, f"{family} rendered no turn"
    assert builds[0][:2] == ("full", "new_key")
    # Templates that re-render history (DeepSeek moves the tool prompt, Qwen3 drops earlier reasoning)
    # rebuild from where they diverge; still, at most one later turn is a full build.
    assert sum(b == "full" for b, _, _ in builds[1:]) <= 1 and builds[-1][0] == "incremental", builds
    if family == "demo":  # the demo template only ever appends
        assert all(reason == "extends" for _, reason, _ in builds[1:]), builds


def test_fastokens_is_the_demo_encoder_and_agrees() -> None:
    demo = load_model_dir("")
    assert demo.encoder.backend == "fastokens"
    text = _agent_render(kit("demo")) * 3
    assert demo.encoder.encode(text) == list(demo.tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("family", FAMILIES[1:])
def test_family_tokenizers_load_in_fastokens(family: str) -> None:
    demo = load_model_dir("")
    fam = kit(family)
    assert load_prompt_encoder(fam.reference.to_str(), fam.reference).backend == "fastokens"
    assert demo.encoder.backend == "fastokens"


def test_unloadable_or_disagreeing_fastokens_falls_back_to_tokenizers() -> None:
    demo = load_model_dir("")
    assert load_prompt_encoder("{not json", demo.tokenizer).backend == "tokenizers"
    other = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    other.add_special_tokens([AddedToken("hello", special=True, normalized=False)])
    # fastokens loads the demo tokenizer, but its ids differ from the reference's (which splits "hello")
    assert load_prompt_encoder((DEMO_MODEL_DIR / "tokenizer.json").read_text(), other).backend == "tokenizers"


def test_boundary_tokens_exclude_tokens_that_can_match_across_a_cut() -> None:
    tok = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    tok.add_special_tokens([
        AddedToken("<|im_start|>user", special=True, normalized=False),  # longer, same start as <|im_start|>
        AddedToken("<eot>", special=True, normalized=False, lstrip=True),  # takes the whitespace before it
        AddedToken("ab<x>", special=True, normalized=False),  # ends with the start of <x>
        AddedToken("<x>", special=True, normalized=False),
    ])
    names = set(boundary_tokens(tok).values())
    assert "<|im_end|>" in names and "<think>" in names
    assert not names & {"<|im_start|>", "<eot>", "<x>"}
    assert "<|im_start|>user" in names and "ab<x>" in names


def test_build_reasons_and_bounds() -> None:
    fam = kit("demo")
    cache = PromptCache(fam.encode, boundary_tokens(fam.reference), max_keys=2, lines_per_key=2)
    base = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    def how(key: str, text: str) -> tuple[str, str]:
        encoded = cache.encode(key, text)
        assert list(encoded.token_ids) == fam.full(text)
        return encoded.build, encoded.reason

    assert how("", base) == ("full", "anonymous")
    assert how("a", base) == ("full", "new_key")
    assert how("a", base) == ("incremental", "extends")
    first = cache.encode("b", base)
    assert (first.build, first.reason) == ("full", "new_key")
    turn2 = base + "hello<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    second = cache.encode("b", turn2)
    assert (second.build, second.reason) == ("incremental", "extends") and second.reused_tokens > 0
    assert list(second.token_ids) == fam.full(turn2)
    rewritten = turn2.replace("hi<|im_end|>", "hey<|im_end|>")
    partial = cache.encode("b", rewritten)  # diverges inside the first user message: the system part is kept
    assert (partial.build, partial.reason) == ("incremental", "rewritten")
    assert list(partial.token_ids) == fam.full(rewritten)
    changed = "<|im_start|>system\nbe long" + turn2[len("<|im_start|>system\nbe brief"):]
    assert how("b", changed) == ("full", "rewritten")  # nothing before the divergence to reuse
    assert how("b", "x" + turn2) == ("full", "rewritten")
    assert how("d", base) == ("full", "new_key")  # a third key: the least recently used ("a") goes
    assert how("a", base) == ("full", "new_key")
    assert PromptCache(fam.encode, {}).encode("a", base).reason == "disabled"


def test_cache_is_bounded_by_tokens() -> None:
    fam = kit("demo")
    cache = PromptCache(fam.encode, boundary_tokens(fam.reference), max_tokens=100)
    for i in range(10):
        cache.encode(f"k{i}", f"<|im_start|>user\n{'word ' * 30}{i}<|im_end|>\n")
    assert cache.cached_tokens <= 100


@given(a=texts, b=texts, c=texts)
def test_common_prefix(a: str, b: str, c: str) -> None:
    x, y = a + b, a + c
    n = common_prefix(x, y, chunk=4)
    assert x[:n] == y[:n] and (n == min(len(x), len(y)) or x[n] != y[n])


def test_model_format_builds_incrementally_per_session() -> None:
    fmt = ModelFormat(load_model_dir(""), reasoning_parser="qwen3", tool_parser="hermes", now=lambda: FIXED_NOW)
    messages = [ChatMessage("system", (TextPart("You are helpful."),)), ChatMessage("user", (TextPart("hi"),))]
    seen = []
    for k in range(3):
        prompt = fmt.build_prompt(Conversation(tuple(messages)), session="s1")
        assert list(prompt.token_ids) == fmt.model_dir.tokenizer.encode(prompt.text, add_special_tokens=False).ids
        assert fmt.build_prompt(Conversation(tuple(messages))).token_ids == list(prompt.token_ids)  # anonymous: full
        seen.append((prompt.build, prompt.build_reason))
        messages += [ChatMessage("assistant", (ReasoningPart("think"), TextPart(f"answer {k}"),
                                               ToolCallPart("c", "Bash", '{"command": "ls"}'))),
                     ChatMessage("tool", (TextPart("a.py"),), tool_call_id="c")]
    assert seen == [("full", "new_key"), ("incremental", "extends"), ("incremental", "extends")]


def test_a_long_anonymous_conversation_is_keyed_by_its_opening_and_builds_incrementally() -> None:
    fmt = ModelFormat(load_model_dir(""), reasoning_parser="qwen3", tool_parser="hermes", now=lambda: FIXED_NOW)
    system = ChatMessage("system", (TextPart("You are a coding agent. " + "Follow the rules. " * 1200),))
    messages = [system, ChatMessage("user", (TextPart("fix the build"),))]
    seen = []
    for k in range(3):
        prompt = fmt.build_prompt(Conversation(tuple(messages)))  # no session: keyed by its opening text
        assert list(prompt.token_ids) == fmt.model_dir.tokenizer.encode(prompt.text, add_special_tokens=False).ids
        seen.append((prompt.build, prompt.build_reason))
        messages += [ChatMessage("assistant", (TextPart(f"step {k}"), ToolCallPart(f"c{k}", "Bash", '{"a": 1}'))),
                     ChatMessage("tool", (TextPart(f"out {k}"),), tool_call_id=f"c{k}")]
    assert seen == [("full", "new_key"), ("incremental", "extends"), ("incremental", "extends")]
    short = fmt.build_prompt(Conversation((ChatMessage("user", (TextPart("hi"),)),)))
    assert (short.build, short.build_reason) == ("full", "anonymous")  # short: not worth a cache line



@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 256, 65536, 4097]), max_size=300),
       wanted=st.sets(st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 256, 65536, 4097]), max_size=80))
def test_boundary_positions_are_those_a_plain_pass_finds(ids: list[int], wanted: set[int]) -> None:
    """Where the boundary ids stand in a render's ids (one vectorised pass): exactly what the plain pass finds."""
    from array import array

    import numpy

    from services.parse.prompt_cache import positions_of

    expected = [i for i, t in enumerate(ids) if t in wanted]
    assert positions_of(array("I", ids), numpy.array(sorted(wanted), dtype=numpy.uint32)) == expected
