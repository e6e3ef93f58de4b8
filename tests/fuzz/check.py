"""What a fuzzed response must look like: no 5xx, every error in its API's own shape, streams well framed.

Each check returns a list of problems (empty: fine). Shapes are the gateway's:
OpenAI ``{"error": {"message", "type", "param", "code"}}`` (chat, Responses, tokenize);
Anthropic ``{"type": "error", "error": {"type", "message"}, "request_id"}`` (``/v1/messages*`` and any
request with ``anthropic-version``); after the first SSE byte the same bodies go in-band
(Responses: ``response.failed`` with ``response.error``).
"""

from __future__ import annotations

import json
from typing import Any

# Error types that mean the server failed (a 5xx in disguise when sent in-band).
SERVER_TYPES = frozenset({"server_error", "api_error", "service_unavailable", "overloaded_error"})


def openai_error_problems(payload: Any) -> list[str]:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return ["not in OpenAI's error shape"]
    problems = []
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append("OpenAI error without message")
    if not isinstance(error.get("type"), str) or not error["type"]:
        problems.append("OpenAI error without type")
    if "param" not in error or "code" not in error:
        problems.append("OpenAI error without param/code keys")
    return problems


def anthropic_error_problems(payload: Any) -> list[str]:
    if not isinstance(payload, dict) or payload.get("type") != "error" or not isinstance(payload.get("error"), dict):
        return ["not in Anthropic's error shape"]
    error = payload["error"]
    problems = []
    if not isinstance(error.get("type"), str) or not error["type"]:
        problems.append("Anthropic error without type")
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append("Anthropic error without message")
    return problems


def error_problems(payload: Any, anthropic: bool) -> list[str]:
    return anthropic_error_problems(payload) if anthropic else openai_error_problems(payload)


def status_problems(status: int, body: bytes, anthropic: bool) -> list[str]:
    """A non-streamed answer (or a stream refused before its first byte)."""
    if status >= 500:
        return [f"status {status}"]
    if status < 400:
        try:
            json.loads(body)
        except ValueError:
            return [f"status {status} with a body that is not JSON"]
        return []
    try:
        payload = json.loads(body)
    except ValueError:
        return [f"status {status} with a body that is not JSON"]
    return error_problems(payload, anthropic)


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """``(event name, data)`` of each server-sent event."""
    out = []
    for block in body.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            out.append((name, "\n".join(data)))
    return out


def stream_problems(api: str, body: bytes) -> list[str]:
    """A 200 event stream: frames parse, an in-band error is in the API's shape and no server error, it ends."""
    try:
        events = sse_events(body)
    except UnicodeDecodeError:
        return ["stream is not UTF-8"]
    if not events:
        return ["empty stream"]
    problems: list[str] = []
    for name, data in events:
        if data == "[DONE]":
            continue
        try:
            frame = json.loads(data)
        except ValueError:
            return [f"stream frame is not JSON: {data[:80]!r}"]
        error = _in_band_error(api, name, frame)
        if error is not None:
            problems += error_problems(error, api == "messages")
            kind = (error.get("error") or {}).get("type") if isinstance(error, dict) else None
            if kind in SERVER_TYPES:
                problems.append(f"in-band {kind}: {str(error)[:200]}")
    last_name, last = events[-1]
    ends = {"chat": last == "[DONE]", "messages": last_name in ("message_stop", "error"),
            "responses": last_name in ("response.completed", "response.incomplete", "response.failed")}
    if not ends[api]:
        problems.append(f"stream ended without its final frame (last: {last_name} {last[:80]!r})")
    return problems


def _in_band_error(api: str, name: str | None, frame: Any) -> Any:
    if api == "chat" and isinstance(frame, dict) and "error" in frame:
        return frame
    if api == "messages" and name == "error":
        return frame
    if api == "responses" and name == "response.failed":
        error = (frame.get("response") or {}).get("error") if isinstance(frame, dict) else None
        return {"error": error}
    return None
