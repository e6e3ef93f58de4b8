"""Message reuse across the gateway -> parse hop (``services.common.message_reuse``): a conversation's next
turn travels as its new messages, and the parse service rebuilds exactly the whole conversation, or
refuses and gets the request whole again."""

from __future__ import annotations

import random

import grpc
import pytest

from services.api import chat_pb2, common_pb2
from services.common import errors
from services.common.message_reuse import (
    MIN_REUSE_BYTES,
    MessageSender,
    MessageStore,
    chain_all,
    conversation_key,
    strip,
)

pytestmark = pytest.mark.timeout(30)


def message(role: str, size: int, seed: int) -> chat_pb2.Message:
    rng = random.Random(seed)
    text = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "parse", "tool")) for _ in range(size // 6))
    return chat_pb2.Message(role=role, parts=[chat_pb2.Part(text=text)])


def chat(messages: list[chat_pb2.Message], session: str = "") -> chat_pb2.ChatRequest:
    identity = common_pb2.Identity(session_id=session or "sess-anon", anonymous=not session)
    return chat_pb2.ChatRequest(model="m", messages=messages, identity=identity)


def converted(request: chat_pb2.ChatRequest, store: MessageStore[str]) -> list[str]:
    """What parse does: the held messages, then the request's own, each "converted" to its text."""
    values = [*store.held(request), *(m.parts[0].text for m in request.messages)]
    store.keep(request, values, len)
    return values


def conversation(turns: int) -> list[chat_pb2.Message]:
    out = [message("system", 9_000, 0), message("user", 9_000, 1)]
    for t in range(turns):
        out += [message("assistant", 600, 10 + t), message("tool", 3_000, 100 + t)]
    return out


def texts(messages: list[chat_pb2.Message]) -> list[str]:
    return [m.parts[0].text for m in messages]


@pytest.mark.parametrize("session", ["", "s1"])
def test_each_next_turn_travels_as_its_new_messages_and_is_rebuilt_exactly(session: str) -> None:
    sender, store = MessageSender(), MessageStore[str]()
    for turn in range(1, 6):
        whole = chat(conversation(turn), session)
        short = sender.shorten(whole)
        assert whole.messages_key
        if turn == 1:
            assert short is None
            assert converted(whole, store) == texts(conversation(1))
            continue
        assert short is not None and short.messages_key == whole.messages_key
        assert short.messages_base.count == 2 * turn  # everything the turn before sent
        assert len(short.messages) == 2
        assert converted(short, store) == texts(conversation(turn))
    assert (sender.shortened, store.rebuilt, store.refused) == (4, 4, 0)


def test_a_rewritten_history_sends_the_messages_after_the_first_change() -> None:
    sender, store = MessageSender(), MessageStore[str]()
    first = chat(conversation(3))
    assert sender.shorten(first) is None
    converted(first, store)
    edited = conversation(4)
    edited[3] = message("tool", 3_000, 999)  # a compaction rewrote the first tool result
    short = sender.shorten(chat(edited))
    assert short is not None and short.messages_base.count == 3
    assert converted(short, store) == texts(edited)


def test_a_store_without_the_base_refuses_with_failed_precondition() -> None:
    sender, store = MessageSender(), MessageStore[str]()
    sender.shorten(chat(conversation(1)))  # parse never saw it (another replica, or it restarted)
    short = sender.shorten(chat(conversation(2)))
    assert short is not None
    with pytest.raises(errors.PromptBaseUnknownError) as info:
        store.held(short)
    assert info.value.grpc_status == grpc.StatusCode.FAILED_PRECONDITION
    assert store.refused == 1


def test_another_conversation_under_the_same_key_fails_the_digest() -> None:
    sender, store = MessageSender(), MessageStore[str]()
    first = chat(conversation(1), "s1")
    sender.shorten(first)
    converted(first, store)
    other = conversation(1)
    other[1] = message("user", 9_000, 77)  # another gateway's conversation under the same session
    elsewhere = chat(other, "s1")
    assert MessageSender().shorten(elsewhere) is None
    converted(elsewhere, store)
    short = sender.shorten(chat(conversation(2), "s1"))
    assert short is not None
    with pytest.raises(errors.PromptBaseUnknownError):
        store.held(short)


def test_a_short_conversation_goes_whole_and_is_kept_nowhere() -> None:
    sender, store = MessageSender(), MessageStore[str]()
    small = [message("system", 100, 0), message("user", 100, 1)]
    for turn in (chat(small), chat([*small, message("assistant", 100, 2)])):
        assert sender.shorten(turn) is None and not turn.messages_key  # parse keeps nothing either
        converted(turn, store)
    assert sum(m.ByteSize() for m in small) < MIN_REUSE_BYTES
    grown = chat([*small, message("assistant", 100, 2), message("tool", 2 * MIN_REUSE_BYTES, 3)])
    assert sender.shorten(grown) is None and grown.messages_key  # long enough now: kept for the next turn


def test_the_key_is_the_session_and_trajectory_else_the_opening_messages() -> None:
    blobs = [m.SerializeToString() for m in conversation(2)]
    named = common_pb2.Identity(session_id="s", trajectory_id="t")
    assert conversation_key(named, blobs) == "s:s/t"
    anonymous = common_pb2.Identity(session_id="sess-x", anonymous=True)
    assert conversation_key(anonymous, blobs) == conversation_key(anonymous, blobs[:2] + blobs[3:])
    assert conversation_key(anonymous, blobs) != conversation_key(anonymous, blobs[1:])
    assert conversation_key(anonymous, blobs[:1]) == ""


def test_the_digest_chain_extends_by_the_new_messages_only() -> None:
    blobs = [m.SerializeToString() for m in conversation(3)]
    whole = chain_all(blobs)
    assert chain_all(blobs[4:], whole[3]) == whole[4:]
    assert len(set(whole)) == len(whole)


def test_stores_are_bounded_in_bytes_least_recently_used_first() -> None:
    store = MessageStore[str](max_bytes=60_000)
    for n in range(4):
        request = chat(conversation(1), f"s{n}")
        request.messages_key = f"s:{n}"
        converted(request, store)
    sender = MessageSender()
    sender.shorten(chat(conversation(1), "s0"))
    short = sender.shorten(chat(conversation(2), "s0"))
    assert short is not None
    short.messages_key = "s:0"
    with pytest.raises(errors.PromptBaseUnknownError):
        store.held(short)  # evicted: the oldest of four ~21 KB conversations in 60 KB


def test_strip_clears_what_a_client_set() -> None:
    request = chat(conversation(1))
    request.messages_key = "s:someone-else"
    request.messages_base.count = 3
    strip(request)
    assert not request.HasField("messages_base") and not request.messages_key
