"""Loading a Hugging Face-format model directory: tokenizer, chat template, special tokens, config.

Accepted layout (any HF model repo has it): ``tokenizer.json``, ``tokenizer_config.json`` (chat
template inside it, or in ``chat_template.jinja``), optional ``config.json`` and
``generation_config.json``. The repo's demo model (``services/common/demo_model``) is the default.

A directory may also carry ``harnessmesh.json`` (:data:`SERVING_FILE`): how to serve it when the flags do not
say, ``{"served_model_name": ..., "reasoning_parser": ..., "tool_parser": ...}`` (each optional; the parse
service reads it, and its flags override it). The demo model's names its Qwen3-style parsers.

Prompt encoding (``ModelDir.encoder``, built on first use: workers never pay for it) goes through
``fastokens`` (the Rust tokenizer Dynamo and vLLM adopted: ~100x faster than ``tokenizers`` on a
100k-token prompt), checked at load against ``tokenizers`` on probe texts built from the model's own
added tokens; where fastokens cannot load the ``tokenizer.json`` or disagrees on a probe, prompts are
encoded with ``tokenizers``. Decoding always uses ``tokenizers`` (``ModelDir.tokenizer``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer

from services.common.errors import InvalidRequestError

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
SERVING_FILE = "harnessmesh.json"  # a model directory's serving defaults (ServingDefaults)


def _log() -> Any:
    """The logger, imported when first needed: the replay simulator loads a model directory and logs nothing,
    and structlog's import (with rich's) is ~70 ms of its start-up."""
    import structlog

    return structlog.get_logger()
SEGMENT_CACHE_BYTES = 64 << 20  # fastokens' segment cache (text between added tokens -> ids), unless
# FASTOKENS_SEGMENT_CACHE (MiB) is set: it serves full builds after a rewritten history
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


class ModelDirError(InvalidRequestError):
    """The model directory is missing a file or holds one that cannot be read."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclass(frozen=True)
class ServingDefaults:
    """How a model directory asks to be served (its ``harnessmesh.json``); empty: not said, the flags decide.

    Parser names are checked by the parse service against its registry, like the flags'."""

    served_model_name: str = ""
    reasoning_parser: str = ""
    tool_parser: str = ""

    @classmethod
    def read(cls, path: Path) -> ServingDefaults:
        data = _read_json(path)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ModelDirError(f"{str(path)!r}: unknown keys {sorted(unknown)}")
        bad = [key for key, value in data.items() if not isinstance(value, str)]
        if bad:
            raise ModelDirError(f"{str(path)!r}: {', '.join(sorted(bad))} must be strings")
        return cls(**data)


@dataclass(frozen=True)
class ModelDir:
    """Everything the mesh needs from a model directory, loaded once at start."""

    path: Path
    tokenizer: Tokenizer
    chat_template: str
    special_tokens: dict[str, str]          # bos_token, eos_token, ... -> token text (template variables)
    eos_token_ids: tuple[int, ...]          # ids that end generation
    max_model_len: int
    config: dict[str, Any] = field(default_factory=dict)
    serving: ServingDefaults = ServingDefaults()

    @property
    def name(self) -> str:
        return self.path.name

    @cached_property
    def encoder(self) -> PromptEncoder:
        """The prompt encoder (fastokens where it agrees with ``tokenizer``); built on first use."""
        return load_prompt_encoder((self.path / "tokenizer.json").read_text(encoding="utf-8"), self.tokenizer,
                                   source=str(self.path))


class PromptEncoder(Protocol):
    """Text -> token ids without extra special tokens: exactly ``Tokenizer.encode(text, add_special_tokens=False)``."""

    backend: str  # "fastokens" or "tokenizers"

    def encode(self, text: str) -> list[int]: ...


class Encoder:
    """Prompt encoding with a tokenizer of the ``tokenizers`` API: Hugging Face ``tokenizers`` (the reference,
    the fallback) or ``fastokens`` (same ids: checked by ``load_prompt_encoder``); ``backend`` names which."""

    def __init__(self, tokenizer: Any, backend: str = "tokenizers") -> None:
        self._tokenizer = tokenizer
        self.backend = backend

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


def probe_texts(tokenizer: Tokenizer) -> list[str]:
    """Texts on which a second encoder must give ``tokenizer``'s ids: each added token between words,
    whitespace runs, digits, punctuation, code and non-ASCII text, alone and glued to its neighbours."""
    body = ("Hello, world!  It's 2026-01-15T09:30:00 \u2014 caf\u00e9 \u65e5\u672c\u8a9e \U0001f600\n\n"
            "def f(x):\n\treturn x**2  # 12345 tokens\n   \r\n{\"a\": [1, 2.5e-3, null]}\u00a0\u200b end")
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    texts = [body, body.upper(), " " + body, body + "  "]
    for token in added:
        texts += [f"{body}{token}\n{body}", f"x{token}y", f" {token} ", f"{token}{token}\n\n{token}", token]
    texts.append("".join(added) + body + "\n".join(added))
    return texts


def load_prompt_encoder(tokenizer_json: str, reference: Tokenizer, *, source: str = "") -> PromptEncoder:
    """fastokens for ``tokenizer_json`` (the file's text) when it loads and matches ``reference`` (the same
    tokenizer loaded by ``tokenizers``) on every ``probe_texts``; else ``reference``. ``source`` names it in logs."""
    fallback = Encoder(reference)
    try:
        import fastokens  # type: ignore[import-untyped]  # ships no py.typed

        fast = fastokens.Tokenizer.from_json_str(tokenizer_json)
        if not os.environ.get("FASTOKENS_SEGMENT_CACHE"):
            fast.enable_segment_cache(SEGMENT_CACHE_BYTES)
        candidate = Encoder(fast, "fastokens")
        for text in probe_texts(reference):
            if candidate.encode(text) != fallback.encode(text):
                _log().warning("model_dir.fastokens_mismatch", model=source, probe=text[:80])
                return fallback
    except Exception as exc:  # any failure to load means: use the reference tokenizer
        _log().warning("model_dir.fastokens_unavailable", model=source, error=f"{type(exc).__name__}: {exc}")
        return fallback
    return candidate


def load_model_dir(path: str | Path | None) -> ModelDir:
    """Load ``path`` (or the demo model when empty) and fail with a clear error if it is unusable."""
    root = Path(path) if path else DEMO_MODEL_DIR
    if not root.is_dir():
        raise ModelDirError(f"model directory {str(root)!r} does not exist")
    tok_file = root / "tokenizer.json"
    if not tok_file.is_file():
        raise ModelDirError(f"{str(root)!r} has no tokenizer.json (a Hugging Face fast tokenizer is required)")
    tokenizer = Tokenizer.from_file(str(tok_file))
    tok_config = _read_json(root / "tokenizer_config.json")
    config = _read_json(root / "config.json")
    gen_config = _read_json(root / "generation_config.json")

    template_file = root / "chat_template.jinja"
    template = tok_config.get("chat_template")
    if template_file.is_file():
        template = template_file.read_text()
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str) or not template:
        raise ModelDirError(f"{str(root)!r} has no chat template (tokenizer_config.json or chat_template.jinja)")

    special: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        text = _token_text(tok_config.get(key))
        if text is not None:
            special[key] = text

    eos_ids: list[int] = []
    for source in (gen_config.get("eos_token_id"), config.get("eos_token_id")):
        for value in source if isinstance(source, list) else [source]:
            if isinstance(value, int) and value not in eos_ids:
                eos_ids.append(value)
    eos_text = special.get("eos_token")
    if eos_text is not None:
        eos_id = tokenizer.token_to_id(eos_text)
        if eos_id is not None and eos_id not in eos_ids:
            eos_ids.append(eos_id)

    max_len = config.get("max_position_embeddings") or tok_config.get("model_max_length") or 32768
    if not isinstance(max_len, int) or max_len > 10**8:
        max_len = 32768
    return ModelDir(
        path=root,
        tokenizer=tokenizer,
        chat_template=template,
        special_tokens=special,
        eos_token_ids=tuple(eos_ids),
        max_model_len=max_len,
        config=config,
        serving=ServingDefaults.read(root / SERVING_FILE),
    )


def served_name(model: str | Path | None, flag: str = "") -> str:
    """The model's name to clients, without loading its tokenizer: ``flag`` (``--served-model-name``), else
    the directory's ``harnessmesh.json``, else the directory's name (as the parse service decides it)."""
    root = Path(model) if model else DEMO_MODEL_DIR
    return flag or ServingDefaults.read(root / SERVING_FILE).served_model_name or root.name


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelDirError(f"{str(path)!r} is not a JSON object")
    return data


def input_modalities(config: dict[str, Any]) -> list[str]:
    """What the model accepts, read from its ``config.json``: always text, plus image/audio encoders."""
    modalities = ["text"]
    if any(key in config for key in ("vision_config", "image_token_id", "image_token_index")):
        modalities.append("image")
    if any(key in config for key in ("audio_config", "audio_token_id", "audio_token_index")):
        modalities.append("audio")
    return modalities
