"""Speculative prefill (``agent_hints.speculative_prefill``): warm the next turn's prefix after a turn.

While a turn streams, :class:`TurnRecorder` keeps what the client will send back as the assistant
message (reasoning, text, tool calls). After the turn, :func:`next_turn_request` renders the conversation
plus that message exactly as the chat template will replay it next turn (no generation prompt) and builds
a ``prefill_only`` request pinned to the worker that ran the turn. The router computes its KV there and
streams no tokens, so the next turn hits the cache even when the template re-renders the assistant turn
differently from the tokens the model generated. Best effort: failures are logged, never surfaced.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import structlog

from services.api import chat_pb2, worker_pb2
from services.common import token_bytes
from services.common.prompt_reuse import ReusingStub
from services.parse import convert
from services.parse.conversation import ChatMessage, Conversation, Part, ReasoningPart, TextPart, ToolCallPart
from services.parse.model_format import ModelFormat
from services.parse.parsers.events import Event, ReasoningDelta, TextDelta, ToolCallDispatch

log = structlog.get_logger()


class TurnRecorder:
    """Collects one turn's parsed output as the assistant message the harness will send back."""

    def __init__(self) -> None:
        self._parts: list[Part] = []

    def observe(self, events: list[Event]) -> None:
        for event in events:
            last = self._parts[-1] if self._parts else None
            if isinstance(event, ReasoningDelta):
                if isinstance(last, ReasoningPart):
                    self._parts[-1] = ReasoningPart(last.text + event.text)
                else:
                    self._parts.append(ReasoningPart(event.text))
            elif isinstance(event, TextDelta):
                if isinstance(last, TextPart):
                    self._parts[-1] = TextPart(last.text + event.text)
                else:
                    self._parts.append(TextPart(event.text))
            elif isinstance(event, ToolCallDispatch):
                self._parts.append(ToolCallPart(event.id, event.name, event.arguments_json))

    def message(self) -> ChatMessage:
        """The turn as harnesses send it back: content "" when it had no text (Anthropic and Responses always
        do, OpenAI clients mostly; templates such as Qwen3's fail on a turn without content)."""
        if any(isinstance(p, TextPart) for p in self._parts):
            return ChatMessage("assistant", tuple(self._parts))
        return ChatMessage("assistant", (*self._parts, TextPart("")))


def next_turn_request(
    fmt: ModelFormat, request: chat_pb2.ChatRequest, recorder: TurnRecorder, *, request_id: str, worker_id: str,
    conversation: Conversation | None = None,
) -> worker_pb2.GenerateRequest:
    """The prefill-only request for the predicted next-turn prefix (see module docstring). ``conversation``:
    the request's, as the turn converted it (required when the request came as its new messages only)."""
    if conversation is None:
        conversation = convert.conversation_from_proto(request)
    predicted = replace(conversation, messages=(*conversation.messages, recorder.message()),
                        add_generation_prompt=False, continue_final_message=False)
    prompt = fmt.build_prompt(predicted)
    out = convert.generate_request(request, prompt, request_id=f"{request_id}-spec", model=fmt.served_model_name,
                                   stop_token_ids=fmt.stop_token_ids)
    out.token_ids_u32 = token_bytes.pack(prompt.token_ids)  # sent as it is (a prefill, off the turn's path)
    out.prefill_only = True
    out.target_worker_id = worker_id
    out.hints.speculative_prefill = False
    out.hints.priority = max(min(out.hints.priority, 0) - 1, -(2**31))  # never ahead of real turns (int32)
    return out


class SpeculativePrefiller:
    """Runs speculative prefills in the background; :meth:`close` cancels the ones still running."""

    def __init__(self, fmt: ModelFormat, router: ReusingStub) -> None:
        self._format = fmt
        self._router = router
        self._tasks: set[asyncio.Task[None]] = set()

    def after_turn(self, request: chat_pb2.ChatRequest, recorder: TurnRecorder, *, request_id: str,
                   worker_id: str, conversation: Conversation | None = None) -> None:
        task = asyncio.create_task(self._run(request, recorder, request_id, worker_id, conversation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: chat_pb2.ChatRequest, recorder: TurnRecorder, request_id: str,
                   worker_id: str, conversation: Conversation | None) -> None:
        try:
            msg = await asyncio.to_thread(next_turn_request, self._format, request, recorder,
                                          request_id=request_id, worker_id=worker_id, conversation=conversation)
            async for _frame in self._router.Generate(msg):
                pass
            log.info("parse.speculative_prefill_done", request_id=request_id, worker_id=worker_id,
                     prompt_tokens=token_bytes.count(msg.token_ids_u32))
        except Exception as exc:
            log.warning("parse.speculative_prefill_failed", request_id=request_id, error=str(exc))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
