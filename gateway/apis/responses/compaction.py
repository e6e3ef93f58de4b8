"""Compaction on the Responses API: the model summarizes the conversation, the client gets the summary sealed.

Two request forms, one implementation (docs/conversation-mapping.md, "Compaction"):

- ``POST /v1/responses`` whose ``input`` ends with ``{"type": "compaction_trigger"}`` (Codex's
  ``responses_compaction_v2``, used when its provider is named OpenAI): the answer's output is exactly one
  item, ``{"type": "compaction", "id", "encrypted_content"}``, streamed or not. The stream is
  ``response.created``, ``response.in_progress``, a ``response.compaction.compacting`` event (no content)
  for each batch in which the model wrote something (so a long summary is never a silent stream), then
  ``output_item.added`` / ``output_item.done`` and ``response.completed``. Codex fails the compaction unless
  exactly one ``output_item.done`` carries a compaction item, so the model's text, reasoning and tool calls
  are never items of their own.
- ``POST /v1/responses/compact`` (the v1 endpoint): one JSON object, ``{"id", "object":
  "response.compaction", "created_at", "output", "usage"}``, whose ``output`` is the input's user messages
  as sent followed by the compaction item.

Either way the conversation is rendered exactly as the turn before it was (instructions, tools, every item),
and the model catalog's ``compaction_instruction`` for the model is one more user message after it, so the
engine's prefix cache serves all but that message. The model's answer text is the summary.
``encrypted_content`` is the summary sealed with the gateway's signing key (``gateway.signing.Sealer``):
opaque to the client, and a ``compaction`` input item whose content is not ours, or was changed, is a 400
naming the item. A valid one becomes a user message holding the summary (after ``SUMMARY_PREFIX``) where it
stands in the input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.apis.responses.encode import new_id, usage_dict
from gateway.apis.responses.errors import failed_error
from gateway.signing import Sealer, SigningKey
from gateway.turn import OUTPUT, TurnFold
from services.api import chat_pb2
from services.common import errors

TRIGGER = "compaction_trigger"
SEAL_PREFIX = "hmc1."
SUMMARY_PREFIX = ("The conversation before this point was compacted. This summary of it was written when it "
                  "was compacted:\n\n")
NO_SUMMARY = "(no summary available)"


def compaction_sealer(key: str | SigningKey) -> Sealer:
    """The sealer of ``compaction`` items' ``encrypted_content`` under the gateway's signing key."""
    return Sealer(key, use="responses.compaction", prefix=SEAL_PREFIX)


def ends_with_trigger(raw: Any) -> bool:
    """Whether a request's ``input`` ends with a ``compaction_trigger`` item."""
    return isinstance(raw, list) and bool(raw) and isinstance(raw[-1], dict) and raw[-1].get("type") == TRIGGER


def opened_summary(sealer: Sealer | None, blob: str, param: str) -> str:
    """The summary sealed in a ``compaction`` item's ``encrypted_content``; anything else is a 400 naming the
    item (``param``, e.g. ``input[3]``)."""
    verdict = sealer.verdict(blob) if sealer is not None else "foreign"
    text = sealer.open(blob) if sealer is not None and verdict == "valid" else None
    if text is None:
        why = {"missing": "is empty",
               "foreign": "was not made by this gateway",
               "invalid": "was changed, or sealed under another signing key (--thinking-signature-key must be the "
                          "same on every gateway replica and across restarts)"}.get(verdict, "cannot be read")
        raise errors.InvalidRequestError(
            f"{param}: this compaction item's encrypted_content {why}; send the conversation it summarizes "
            "instead", param=f"{param}.encrypted_content")
    return text


def summary_message(summary: str) -> chat_pb2.Message:
    """The user message a ``compaction`` input item stands for."""
    return chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=SUMMARY_PREFIX + summary)])


def instruction_message(instruction: str) -> chat_pb2.Message:
    """The summarization instruction, after the conversation."""
    return chat_pb2.Message(role="user", parts=[chat_pb2.Part(text=instruction)])


def user_messages(raw: list[Any]) -> list[dict[str, Any]]:
    """The input's user messages as sent (the v1 endpoint's output keeps them before the compaction item)."""
    return [entry for entry in raw if isinstance(entry, dict) and entry.get("role") == "user"
            and entry.get("type", "message") == "message"]


@dataclass
class CompactionEncoder:
    """The ``TurnEncoder`` of a compaction request: folds the model's answer silently, then one compaction
    item. ``skeleton`` is the ``response`` object's request echo; ``v1_output`` set: the v1 endpoint's reply
    (those items, then the compaction item)."""

    skeleton: dict[str, Any]
    sealer: Sealer
    v1_output: list[dict[str, Any]] | None = None
    fold: TurnFold = field(default_factory=TurnFold)
    complete = False
    item_id: str = field(default_factory=lambda: new_id("cmp"))
    _seq: int = 0
    _item: dict[str, Any] | None = None

    def _ev(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    @property
    def summary(self) -> str:
        """The model's answer text: the summary."""
        return self.fold.text.strip() or NO_SUMMARY

    def response(self, status: str) -> dict[str, Any]:
        body = {**self.skeleton, "status": status, "output": [self._item] if self._item else []}
        if status in ("completed", "failed"):
            body["usage"] = usage_dict(self.fold.usage)
        return body

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [self._ev("response.created", response=snapshot),
                self._ev("response.in_progress", response=snapshot)]

    def feed(self, batch: chat_pb2.ChatEventBatch) -> list[dict[str, Any]]:
        if not any(isinstance(delta, OUTPUT) for delta in self.fold.feed(batch)):
            return []
        return [self._ev("response.compaction.compacting", item_id=self.item_id, output_index=0)]

    def close(self) -> list[dict[str, Any]]:
        self._item = {"id": self.item_id, "type": "compaction", "encrypted_content": self.sealer.seal(self.summary)}
        return [self._ev("response.output_item.added", output_index=0, item=self._item),
                self._ev("response.output_item.done", output_index=0, item=self._item),
                self._ev("response.completed", response=self.reply())]

    def fail(self, error: errors.MeshError) -> list[dict[str, Any]]:
        failed = self.response("failed")
        failed["error"] = failed_error(error)
        return [self._ev("response.failed", response=failed)]

    def reply(self) -> dict[str, Any]:
        if self.v1_output is None:
            return self.response("completed")
        return {"id": self.skeleton["id"], "object": "response.compaction", "created_at": int(time.time()),
                "output": [*self.v1_output, *([self._item] if self._item else [])],
                "usage": usage_dict(self.fold.usage)}
