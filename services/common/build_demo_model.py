"""Build the demo model directory ``services/common/demo_model``.

Run: ``python -m services.common.build_demo_model``.

The demo model is a byte-level BPE tokenizer trained here on a small synthetic corpus, with the
special tokens of a Qwen3-style format; its ChatML/Qwen3-style chat template, written for this
project, is kept in the model directory itself (``demo_model/chat_template.jinja``), and so is the
mocker script served when ``harnessmesh up`` gets no ``--script`` (``demo_model/mocker_script.jsonl``: the
README's examples). Its ``harnessmesh.json`` names how to serve it (served as ``demo``, Qwen3 reasoning and
Hermes tool-call parsers: the markers its template and script use), so ``harnessmesh up`` needs no flags.
It carries no weights: the mocker engine needs only the tokenizer and the template. The
output is committed; rerunning this script reproduces it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from services.common.model_dir import DEMO_MODEL_DIR, SERVING_FILE

VOCAB_SIZE = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Format markers: single tokens (as in Qwen3), but not "special", so they survive decoding.
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

WORDS = (  # noqa: SIM905 - a word list reads best as prose
    "the a an of to in and or is are was be for on with as by at from this that it not you we they "
    "file files read write edit run test tests build error errors fix bug code function class method "
    "call tool tools result results weather city temperature celsius list directory path search query "
    "user assistant system message request response stream token tokens model models prompt cache "
    "worker router gateway parse session turn agent harness json value key name arguments command "
    "output input line lines check pass fail green red data time today tomorrow please can could "
    "would should will let me look first then next done ok yes no need want find show open close "
    "python bash shell git commit diff patch repo branch main import return def async await print"
).split()
JSON_KEYS = ["name", "arguments", "path", "command", "city", "unit", "query", "content", "pattern", "limit"]


def corpus(seed: int = 0, lines: int = 20000) -> Iterator[str]:
    """Deterministic mixed prose / JSON / code lines covering what harness traffic looks like."""
    rng = random.Random(seed)
    for i in range(lines):
        kind = i % 4
        if kind == 0:
            yield " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))).capitalize() + "."
        elif kind == 1:
            obj = {k: rng.choice(WORDS) for k in rng.sample(JSON_KEYS, rng.randint(1, 4))}
            yield json.dumps({"name": rng.choice(WORDS) + "_" + rng.choice(WORDS), "arguments": obj})
        elif kind == 2:
            name = "_".join(rng.sample(WORDS, 2))
            yield f"def {name}({rng.choice(WORDS)}, {rng.choice(WORDS)}={rng.randint(0, 99)}):\n    return {name}"
        else:
            yield f"{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 500)}: {rng.choice(WORDS)} {i}"
    # Digits and punctuation runs so numbers and symbols get merges too.
    yield from ("".join(p) for p in itertools.product("0123456789", repeat=3))


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    return tokenizer


# The template is hand-written and lives only in the committed model directory; a build elsewhere copies it.
CHAT_TEMPLATE = DEMO_MODEL_DIR / "chat_template.jinja"
# Likewise the mocker script `harnessmesh up` serves without --script (the README's examples).
MOCKER_SCRIPT = DEMO_MODEL_DIR / "mocker_script.jsonl"
HAND_WRITTEN = (CHAT_TEMPLATE, MOCKER_SCRIPT)
# How the demo is served without flags (services/common/model_dir.py: ServingDefaults)
SERVING = {"served_model_name": "demo", "reasoning_parser": "qwen3", "tool_parser": "hermes"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEMO_MODEL_DIR)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "add_bos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    if out.resolve() != DEMO_MODEL_DIR.resolve():
        for hand_written in HAND_WRITTEN:
            (out / hand_written.name).write_text(hand_written.read_text())
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    config = {
        "architectures": ["HarnessmeshDemoForCausalLM"],
        "model_type": "harnessmesh-demo",
        "max_position_embeddings": 32768,
        "vocab_size": tokenizer.get_vocab_size(),
        "eos_token_id": eos,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / SERVING_FILE).write_text(json.dumps(SERVING, indent=2) + "\n")
    print(f"wrote demo model to {out}")


if __name__ == "__main__":
    main()
