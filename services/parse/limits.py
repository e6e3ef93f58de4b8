"""How much one request may carry: counts of messages, tools and parts, and the size of one text.

The gateway's ``--max-request-bytes`` bounds a request's bytes; these bound its shape, so that no request
can make the parse service build a million tiny objects (or render them) from a body within the byte limit.
Each limit is a 400 naming the field and the option; 0 turns one off. Checked on the canonical request,
so every API and the gRPC edge get the same limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.errors import InvalidRequestError

if TYPE_CHECKING:  # settings.py imports this module: no protobuf at import time
    from services.api import chat_pb2


@dataclass(frozen=True)
class RequestLimits:
    """Most messages, tools, parts per message and characters per text (text, tool arguments, schemas)."""

    messages: int = 10_000
    tools: int = 1_000
    parts: int = 1_000
    text_chars: int = 4_000_000

    def check(self, request: chat_pb2.ChatRequest, held: int = 0) -> None:
        """Raise InvalidRequestError (400) for the first limit ``request`` exceeds. ``held``: messages before
        ``request.messages`` that parse holds already (``services.common.message_reuse``; checked then)."""
        _at_most(held + len(request.messages), self.messages, "messages", "messages", "--max-messages")
        _at_most(len(request.tools), self.tools, "tools", "tools", "--max-tools")
        for i, tool in enumerate(request.tools):
            _at_most(len(tool.parameters_json), self.text_chars, "characters", f"tools[{i}].parameters_json",
                     "--max-text-chars")
        for i, message in enumerate(request.messages, held):
            _at_most(len(message.parts), self.parts, "parts", f"messages[{i}].parts", "--max-message-parts")
            if self.text_chars:
                for j, part in enumerate(message.parts):
                    kind = part.WhichOneof("kind")
                    text = (part.tool_call.arguments_json if kind == "tool_call"
                            else part.reasoning if kind == "reasoning" else part.text)
                    _at_most(len(text), self.text_chars, "characters", f"messages[{i}].parts[{j}]",
                             "--max-text-chars")


def _at_most(count: int, limit: int, what: str, param: str, option: str) -> None:
    if limit and count > limit:
        raise InvalidRequestError(f"{param} has {count} {what}; at most {limit} are accepted ({option})",
                                  param=param)
