"""Seeded HTTP fuzz cases: a valid seed request of an API, mutated structurally, serialized (or corrupted).

``cases(seed, n)`` is deterministic: the same seed gives the same bodies, headers and order, so every
finding reproduces with ``--seed`` and its case index.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.fuzz.bodies import ENDPOINTS, SEEDS, STREAMING_APIS, WEATHER_SCHEMA, Raw, deep, hostile, odd_string

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Case:
    """One HTTP request of the fuzz run."""

    index: int
    api: str
    path: str
    body: bytes
    headers: dict[str, str | bytes] = field(default_factory=dict)
    stream: bool = False
    mutations: tuple[str, ...] = ()

    @property
    def anthropic_shape(self) -> bool:
        """Answered in Anthropic's error shape (``gateway.apis.anthropic.errors.is_anthropic_request``)."""
        return self.path.startswith("/v1/messages") or any(k.lower() == "anthropic-version" for k in self.headers)


def base_headers(api: str, api_key: str) -> dict[str, str | bytes]:
    headers: dict[str, str | bytes] = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    if api in ("messages", "count_tokens"):
        headers["anthropic-version"] = "2023-06-01"
    return headers


def valid_body(api: str, rng: random.Random, stream: bool = False) -> dict[str, Any]:
    body = copy.deepcopy(SEEDS[api](rng))  # seeds share constants (the weather schema); mutations must not
    if stream:
        body["stream"] = True
    return body


# -- serialization ----------------------------------------------------------------------------------


def serialize(body: Any) -> bytes:
    """``body`` as JSON bytes, :class:`Raw` values spliced in verbatim (ints of any size, NaN as ``NaN``)."""
    raws: list[Raw] = []

    def swap(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value)
            return f"\x00RAW{len(raws) - 1}\x00"
        if isinstance(value, dict):
            return {swap(k): swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    out = json.dumps(swap(body)).encode()
    for i, raw in enumerate(raws):
        marker = f'"\\u0000RAW{i}\\u0000"'.encode()
        out = out.replace(marker, b'"' + raw.data + b'"' if raw.inside_string else raw.data)
    return out


# -- structural mutations ---------------------------------------------------------------------------


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path into ``value`` (dict keys and list indices), parents before children."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield (*prefix, i)
            yield from paths(child, (*prefix, i))


def _parent(body: Any, path: Path) -> Any:
    for step in path[:-1]:
        body = body[step]
    return body


def _containers(body: Any) -> list[Any]:
    out = [body]
    for path in paths(body):
        node = _parent(body, (*path, 0))
        if isinstance(node, dict | list):
            out.append(node)
    return out


def _replace(body: Any, rng: random.Random) -> str:
    path = rng.choice(list(paths(body)))
    _parent(body, path)[path[-1]] = hostile(rng)
    return f"replace {'.'.join(map(str, path))}"


def _delete(body: Any, rng: random.Random) -> str:
    path = rng.choice(list(paths(body)))
    del _parent(body, path)[path[-1]]
    return f"delete {'.'.join(map(str, path))}"


def _extra(body: Any, rng: random.Random) -> str:
    node = rng.choice(_containers(body))
    if isinstance(node, dict):
        node[rng.choice(["extra", "type", "role", "id", "\ud800", "", "cache_control", "__proto__"])] = hostile(rng)
    else:
        node.append(hostile(rng))
    return "extra field"


def _role(body: Any, rng: random.Random) -> str:
    lists = [body[k] for k in ("messages", "input") if isinstance(body.get(k), list) and body[k]]
    if not lists:
        return _replace(body, rng)
    message = rng.choice(rng.choice(lists))
    if isinstance(message, dict):
        message["role"] = rng.choice(["", "User", "bot", "function", "tool", "assistant", "system", "developer",
                                      "model", None, 5, ["user"], "user\x00"])
    return "role"


def _tools(body: Any, rng: random.Random) -> str:
    bad_schema: Any = rng.choice([None, "object", 5, [], {"type": "object", "properties": "x"},
                             {"type": "array", "items": {"$ref": "#"}}, {"$ref": "#/nope"}, deep(rng),
                             {"type": "object", "properties": {odd_string(rng): {"type": odd_string(rng)}}},
                             {"properties": {"x": {"enum": [float("nan"), 2**70]}}}])
    name = rng.choice(["get_weather", "", None, 5, "a" * 2000, "bad name!", "\ud800", "<tool_call>"])
    tool: Any = rng.choice([
        {"type": "function", "function": {"name": name, "parameters": bad_schema}},
        {"type": "function", "name": name, "parameters": bad_schema},
        {"name": name, "input_schema": bad_schema},
        {"type": rng.choice(["custom", "namespace", "web_search", "", None, 7]), "name": name,
         "tools": [{"type": "function", "name": name, "parameters": bad_schema}]},
        {"type": "function", "function": None}, "get_weather", None, [],
    ])
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    tools = [*tools, tool] * rng.choice([1, 1, 1, 50])
    body["tools"] = tools
    if rng.random() < 0.3:
        body["tool_choice"] = rng.choice([
            "any", "required", {"type": "tool"}, {"type": "tool", "name": "nope"}, {"type": "function"},
            {"type": "function", "function": {"name": name}}, {"type": "function", "name": 5}, {"name": None}])
    return "tools"


def _parts(body: Any, rng: random.Random) -> str:
    lists = [body[k] for k in ("messages", "input") if isinstance(body.get(k), list) and body[k]]
    if not lists:
        return _replace(body, rng)
    message = rng.choice(rng.choice(lists))
    if not isinstance(message, dict):
        return "parts"
    part = rng.choice([
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
        {"type": "input_image", "image_url": "x"}, {"type": "text"}, {"type": "text", "text": 5},
        {"type": "text", "text": odd_string(rng)}, {"type": None}, {}, {"text": "no type"}, "a string part",
        {"type": "tool_result"}, {"type": "tool_result", "tool_use_id": "x", "content": [{"type": "video"}]},
        {"type": "tool_use", "id": 1, "name": "get_weather", "input": "not an object"},
        {"type": "thinking"}, {"type": "thinking", "thinking": "x", "signature": odd_string(rng)},
        {"type": "redacted_thinking", "data": 5}, {"type": "input_text", "text": None},
        {"type": "document", "source": None}, {"type": odd_string(rng)},
    ])
    content = message.get("content")
    message["content"] = [*content, part] if isinstance(content, list) else [part]
    return "content part"


def _size(body: Any, rng: random.Random) -> str:
    roll = rng.random()
    for key in ("messages", "input"):
        if isinstance(body.get(key), list) and body[key] and roll < 0.5:
            body[key] = body[key] * rng.choice([0, 2, 100, 1000])
            return f"{key} x N"
    path = rng.choice(list(paths(body)))
    _parent(body, path)[path[-1]] = rng.choice(["", "x" * rng.randrange(100_000, 900_000)])
    return f"size {'.'.join(map(str, path))}"


def _numbers(body: Any, rng: random.Random) -> str:
    key = rng.choice(["max_tokens", "max_completion_tokens", "max_output_tokens", "temperature", "top_p", "top_k",
                      "seed", "n", "stream", "tokens", "budget_tokens"])
    value = hostile(rng) if rng.random() < 0.5 else rng.choice(
        [-1, 0, 2**31, 2**63, 2**64, 10**30, float("nan"), float("inf"), Raw(b"1e400"), -(2**63) - 1, 3.7])
    if key == "budget_tokens":
        body["thinking"] = {"type": "enabled", "budget_tokens": value}
    elif key == "tokens":
        body["tokens"] = [value, 1]
    else:
        body[key] = value
    if rng.random() < 0.3:
        body["nvext"] = {"agent_hints": {rng.choice(["priority", "osl", "speculative_prefill"]): value}}
    return f"number {key}"


_MUTATORS = ((_replace, 40), (_delete, 12), (_extra, 10), (_role, 8), (_tools, 10), (_parts, 10), (_size, 3),
             (_numbers, 12))


def mutate(body: Any, rng: random.Random) -> str:
    funcs, weights = zip(*_MUTATORS, strict=True)
    mutator: Callable[[Any, random.Random], str] = rng.choices(funcs, weights)[0]
    return mutator(body, rng)


# -- raw bodies and headers -------------------------------------------------------------------------


def corrupt(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    """``raw`` made into something that is not (valid) JSON, or not an object."""
    kind = rng.choice(["truncate", "byte", "garbage", "empty", "bom", "types", "utf8", "dup", "utf16", "nul"])
    if kind == "truncate":
        return raw[: rng.randrange(0, max(1, len(raw)))], kind
    if kind == "byte":
        at = rng.randrange(0, len(raw))
        return raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1 :], kind
    if kind == "garbage":
        return raw + rng.choice([b"}", b"garbage", b"\x00", b",", b" {}"]), kind
    if kind == "empty":
        return rng.choice([b"", b" ", b"\n", b"\t\r\n "]), kind
    if kind == "bom":
        return b"\xef\xbb\xbf" + raw, kind
    if kind == "types":
        return rng.choice([b"null", b"12", b'"text"', b"[]", b"[{}]", b"true", b"1e400", b"NaN", b"-"]), kind
    if kind == "utf8":
        return raw.replace(b'"demo"', rng.choice([b'"d\xffmo"', b'"\xed\xa0\x80"', b'"\xc0\xaf"'])), kind
    if kind == "dup":
        return raw.replace(b"{", b'{"model": 5, ', 1), kind
    if kind == "utf16":
        return raw.decode(errors="replace").encode("utf-16"), kind
    return raw.replace(b":", b":\x00", 1), kind


_BAD_HEADERS: list[tuple[str, str | bytes]] = [
    ("content-type", "text/plain"), ("content-type", "application/x-www-form-urlencoded"), ("content-type", ""),
    ("content-type", "application/json; charset=latin-1"), ("content-encoding", "gzip"),
    ("x-harnessmesh-priority", "abc"), ("x-harnessmesh-priority", "99999999999999999999"),
    ("x-harnessmesh-priority", str(2**31)), ("x-harnessmesh-priority", "-5"), ("x-harnessmesh-priority", "1.5"),
    ("x-harnessmesh-osl", str(2**40)), ("x-harnessmesh-osl", "-1"), ("x-harnessmesh-osl", "٣".encode()),
    ("x-harnessmesh-speculative-prefill", "maybe"), ("x-harnessmesh-strip-anthropic-preamble", "2"),
    ("x-session-id", "a" * 4000), ("x-session-id", b"\xff\xfe"), ("x-trajectory-id", ""),
    ("x-parent-session-id", b"\x80"), ("user-agent", b"\xc3\x28 harness"), ("user-agent", ""),
    ("x-harnessmesh-harness", "x" * 2000), ("x-claude-code-session-id", b"\xed\xa0\x80"), ("thread-id", "a b"),
    ("anthropic-version", "garbage"), ("anthropic-beta", "a,,b,"), ("authorization", "Bearer"),
    ("authorization", "Basic Zm9vOmJhcg=="), ("x-api-key", b"\xff"), ("authorization", "Bearer wrong"),
    ("accept", "application/xml"), ("accept-encoding", "br;q=2"), ("traceparent", "00-zz-zz-01"),
    ("baggage", "a=%ff,,;"), ("x-request-id", b"\xa0"), ("idempotency-key", "x" * 3000),
]


def bad_header(headers: dict[str, str | bytes], rng: random.Random) -> str:
    name, value = rng.choice(_BAD_HEADERS)
    if name == "authorization" and "authorization" in headers and rng.random() < 0.5:
        del headers["authorization"]
        return "no key"
    headers[name] = value
    return f"header {name}"


# -- the case stream --------------------------------------------------------------------------------


def cases(seed: int, n: int, api_key: str = "", start: int = 0) -> Iterator[Case]:
    """``n`` cases from ``seed``: ~8% valid controls, ~12% corrupted bytes, the rest mutated seeds."""
    rng = random.Random(seed)
    for index in range(start, start + n):
        path, api = ENDPOINTS[rng.choices(range(len(ENDPOINTS)), [24, 22, 12, 22, 14, 6])[0]]
        stream = api in STREAMING_APIS and rng.random() < 0.4
        body = valid_body(api, rng, stream)
        headers = base_headers(api, api_key)
        done: list[str] = []
        roll = rng.random()
        if roll >= 0.08:
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                if not isinstance(body, dict) or not body:
                    break
                done.append(mutate(body, rng))
        raw = serialize(body)
        if roll >= 0.08 and rng.random() < 0.12:
            raw, kind = corrupt(raw, rng)
            done.append(f"corrupt {kind}")
        if roll >= 0.08 and rng.random() < 0.1:
            done.append(bad_header(headers, rng))
        yield Case(index, api, path, raw, headers, stream, tuple(done))


def follow_up(api: str, api_key: str) -> tuple[str, bytes, dict[str, str | bytes]]:
    """A small valid request of ``api`` (sent on the same connection right after a bad one)."""
    path = dict((a, p) for p, a in ENDPOINTS)[api]
    body = SEEDS[api](random.Random(0))
    return path, serialize(copy.deepcopy(body)), base_headers(api, api_key)


__all__ = ["WEATHER_SCHEMA", "Case", "cases", "follow_up", "serialize"]
