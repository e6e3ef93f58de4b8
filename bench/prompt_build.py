"""Time to build the prompt of a long session's next turn: full build vs incremental, side by side.

An agent session (the demo model's template: system prompt, then assistant turns with reasoning, text
and a tool call, each followed by a tool result) is grown to ~4k and ~100k prompt tokens; then the
next turn (one more assistant step + tool result) is built, and timed as:

* ``full/tokenizers``: render + ``tokenizers`` over the whole text (the build before issue 12);
* ``full/fastokens``:  render + ``fastokens`` over the whole text (an anonymous request today);
* ``incr/tokenizers``: render + the prompt cache over ``tokenizers`` (the fallback encoder);
* ``incr/fastokens``:  render + the prompt cache over ``fastokens`` (a session's turn today).

Incremental builds start from a cache holding the previous turn only (primed, untimed, fresh per
repeat). ``render`` is the chat template alone. Every build's ids are checked equal to the reference.
Times are medians of ``--repeats`` (2 CPU cores shared with other jobs: absolute times are noisy).
Usage: ``python bench/prompt_build.py [--repeats 7] [--sizes 4000,100000]``.

Recorded (2 shared CPU cores, the quietest of three runs; the 4k row's session had 5.2k tokens)::

     tokens  render  full/tokenizers  full/fastokens  incr/tokenizers  incr/fastokens  before/after  reused
       5250     0.4              9.7             0.4              1.4             0.7         13.1x  85.8%
     101386     8.6            164.2            13.7             11.8            11.1         14.8x  99.2%

At 100k tokens the build was tokenization (~155 of 164 ms); now it is the chat template's render
(~9 ms), which must still run whole. fastokens alone removes most of the tokenization; the prompt
cache removes the rest and is what keeps the ``tokenizers`` fallback fast (164 -> 12 ms).

Again at ad589fd (the renderer's namespace fast path), with the incremental builds' id check moved out of
the timed part (it had timed ``list()`` of the ids and their comparison, ~3 ms at 100k). This host on another
day, the quietest of three::

     tokens  render  full/tokenizers  full/fastokens  incr/tokenizers  incr/fastokens  before/after  reused
       5071     0.2              5.1             0.3              1.4             0.6          9.0x  89.1%
     101028     3.8            159.7             6.4              5.7             4.4         36.6x  99.4%

A session's 100k-token turn is now the render plus ~0.6 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.model_dir import Encoder, ModelDir, load_model_dir
from services.parse.conversation import ChatMessage, Conversation, ReasoningPart, TextPart, ToolCallPart, ToolSpec
from services.parse.model_format import ModelFormat
from services.parse.prompt_cache import Encoded, PromptCache, boundary_tokens

WORDS = ("the", "build", "fails", "on", "main", "because", "fixture", "writes", "an", "empty", "file", "so", "read",
         "test", "then", "fix", "writer", "def", "class", "import", "return", "self", "value", "error", "path", "line",
         "assert", "pytest", "module", "function", "config")
TOOLS = (ToolSpec("Bash", "Run a shell command.", json.dumps({"type": "object", "properties": {
    "command": {"type": "string"}}})),)


def session(target_tokens: int, fmt: ModelFormat) -> tuple[Conversation, Conversation]:
    """(turn N, turn N+1): turn N has about ``target_tokens`` prompt tokens."""
    rng = random.Random(0)

    def para(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    messages = [ChatMessage("system", (TextPart(para(400)),)), ChatMessage("user", (TextPart(para(30)),))]

    def step(i: int) -> list[ChatMessage]:
        call = ToolCallPart(f"call_{i}", "Bash", json.dumps({"command": para(6)}))
        return [ChatMessage("assistant", (ReasoningPart(para(60)), TextPart(para(15)), call)),
                ChatMessage("tool", (TextPart(para(200)),), tool_call_id=f"call_{i}")]

    i = 0
    while len(fmt.model_dir.tokenizer.encode(fmt.render(Conversation(tuple(messages), TOOLS))).ids) < target_tokens:
        messages += step(i)
        i += 1
    return Conversation(tuple(messages), TOOLS), Conversation((*messages, *step(i)), TOOLS)


def median_ms(fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def row(model: ModelDir, target: int, repeats: int) -> str:
    """One table row: the next turn of a session of about ``target`` tokens, built every way."""
    fast, slow = model.encoder, Encoder(model.tokenizer)
    fmt = ModelFormat(model, reasoning_parser="qwen3", tool_parser="hermes")
    previous, turn = session(target, fmt)
    prev_text, text = fmt.render(previous), fmt.render(turn)
    reference = slow.encode(text)
    caches: dict[str, PromptCache] = {}

    def primed(name: str, encode: Callable[[str], list[int]]) -> Callable[[], None]:
        def setup() -> None:
            caches[name] = PromptCache(encode, boundary_tokens(model.tokenizer, encode))
            caches[name].encode("s", prev_text)
        return setup

    built: dict[str, object] = {}

    def incremental(name: str) -> Callable[[], None]:
        def build() -> None:
            built[name] = caches[name].encode("s", fmt.render(turn))  # checked after the clock stopped
        return build

    def checked(name: str) -> None:
        encoded = built[name]
        assert isinstance(encoded, Encoded)
        assert list(encoded.token_ids) == reference and encoded.build == "incremental"

    fast.encode(prev_text)  # the server encoded turn N before turn N+1 (fastokens' caches are warm)
    assert fast.encode(text) == reference
    render = median_ms(lambda: fmt.render(turn), repeats)
    full_slow = median_ms(lambda: slow.encode(fmt.render(turn)), repeats)
    full_fast = median_ms(lambda: fast.encode(fmt.render(turn)), repeats)
    incr_slow = median_ms(incremental("slow"), repeats, primed("slow", slow.encode))
    checked("slow")
    incr_fast = median_ms(incremental("fast"), repeats, primed("fast", fast.encode))
    checked("fast")
    primed("fast", fast.encode)()
    kept = caches["fast"].encode("s", text).reused_tokens
    return (f"{len(reference):>7} {render:>7.1f} {full_slow:>16.1f} {full_fast:>15.1f} {incr_slow:>16.1f} "
            f"{incr_fast:>15.1f} {full_slow / incr_fast:>12.1f}x {kept / len(reference):>6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="4000,100000")
    args = parser.parse_args()
    model = load_model_dir("")
    print(f"prompt encoder: {model.encoder.backend}; median of {args.repeats}; times in ms")
    print(f"{'tokens':>7} {'render':>7} {'full/tokenizers':>16} {'full/fastokens':>15} {'incr/tokenizers':>16} "
          f"{'incr/fastokens':>15} {'before/after':>13} {'reused':>7}")
    for target in (int(s) for s in args.sizes.split(",")):
        print(row(model, target, args.repeats))


if __name__ == "__main__":
    main()
