"""Loading a Hugging Face-format model directory: tokenizer, chat template, special tokens, config.

Accepted layout (any HF model repo has it): ``tokenizer.json``, ``tokenizer_config.json`` (chat
template inside it, or in ``chat_template.jinja``), optional ``config.json`` and
``generation_config.json``. The repo's demo model (``services/common/demo_model``) is the default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from services.common.errors import InvalidRequestError

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
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
class ModelDir:
    """Everything the mesh needs from a model directory, loaded once at start."""

    path: Path
    tokenizer: Tokenizer
    chat_template: str
    special_tokens: dict[str, str]          # bos_token, eos_token, ... -> token text (template variables)
    eos_token_ids: tuple[int, ...]          # ids that end generation
    max_model_len: int
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name


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
    )


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
