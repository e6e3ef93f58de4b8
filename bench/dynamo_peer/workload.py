"""Request bodies the bench sends (pure: no I/O besides the tokenizer used to size long histories).

* :func:`short_prompt`: the issue's TTFT prompt, ~150 words, unique per request (no prefix-cache hits).
* :func:`tool_loop_session`: an agent session's history of ~N prompt tokens (system + task + read_file
  calls and results), and its *next turn* (history + one more assistant tool call + its result), which
  a prefix cache serves from cache except for the last few hundred tokens.
* :func:`fallback_long_trace`: a minimal long-prompt Mooncake trace, used only when ``bench/long_trace.py``
  is missing.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

Body = dict[str, Any]

_TEXT = ("the build log shows a failing test in module parser while the router keeps its index of cached "
          "blocks and every worker reports load so please summarise which file changed why the assertion "
          "failed and what the next step should be given that retries migrate a request after its first "
          "token def return import class self value error path config tokens stream event")
_WORDS = tuple(_TEXT.split())

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def short_prompt(words: int = 150) -> str:
    """~``words`` words, starting with a fresh id so no two prompts share a cached block."""
    rng = random.Random()
    return f"Request {uuid.uuid4().hex}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


def chat_body(model: str, messages: list[dict[str, Any]], max_tokens: int, *, tools: bool = False,
              ignore_eos: bool = True) -> Body:
    body: Body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if tools:
        body["tools"] = TOOLS
    return body


def filler(rng: random.Random, words: int) -> str:
    """Code-review-ish text, lines of ~12 words."""
    out = []
    for i in range(0, words, 12):
        out.append(f"{i // 12:5d}  " + " ".join(rng.choice(_WORDS) for _ in range(min(12, words - i))))
    return "\n".join(out)


def _call(i: int, path: str) -> list[dict[str, Any]]:
    call_id = f"call_{i}"
    return [{"role": "assistant", "content": "", "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]}]


def tool_loop_session(tokens: int, tokens_per_word: float, seed: int | None = None,
                      chunk_tokens: int = 4000) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(turn-1 messages of ~tokens prompt tokens, next-turn messages)``.

    ``tokens_per_word``: the tokenizer's rate on :func:`filler` text (:func:`tokens_per_word`). The
    history is tool results of ~``chunk_tokens`` each; the next turn adds one call and a ~200-token result.
    """
    rng = random.Random(seed)
    session = uuid.UUID(int=rng.getrandbits(128)).hex
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Session {session}. You are a coding agent; use the tools."},
        {"role": "user", "content": "Find why the parser test fails. " + filler(rng, 60)},
    ]
    budget = max(0, tokens - 300)
    i = 0
    while budget > 0:
        chunk = min(chunk_tokens, budget)
        messages += _call(i, f"src/module_{i}.py")
        messages.append({"role": "tool", "tool_call_id": f"call_{i}",
                         "content": filler(rng, max(1, int(chunk / tokens_per_word)))})
        budget -= chunk + 30  # the call's own tokens
        i += 1
    next_turn = [*messages, *_call(i, f"tests/test_module_{i}.py"),
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": filler(rng, int(200 / tokens_per_word))}]
    return messages, next_turn


def tokens_per_word(tokenizer_json: str) -> float:
    """Tokens per word of :func:`filler` text under the given ``tokenizer.json``."""
    from tokenizers import Tokenizer  # the main venv has it (our parse service uses it)

    text = filler(random.Random(0), 5000)
    return len(Tokenizer.from_file(tokenizer_json).encode(text).ids) / 5000


def fallback_long_trace(sessions: int = 8, turns: int = 12, max_prompt: int = 100_000,
                        block: int = 512, seed: int = 0) -> list[dict[str, Any]]:
    """Sessions whose prompts grow towards ``max_prompt`` tokens, all overlapping in time (KV pressure)."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    next_id = 0
    for s in range(sessions):
        ids: list[int] = []
        t = s * 500.0
        length = 0
        for turn in range(turns):
            length = int(max_prompt * (turn + 1) / turns)
            while len(ids) * block < length:
                ids.append(next_id)
                next_id += 1
            lines.append({"timestamp": round(t), "input_length": length,
                          "output_length": rng.randint(50, 400), "hash_ids": list(ids)})
            t += 2000 + rng.random() * 2000
    lines.sort(key=lambda x: x["timestamp"])
    return lines
