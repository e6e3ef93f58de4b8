"""Model directories for the fixture chat templates: a template family's template and named tokens over the demo
tokenizer with the family's control strings added as special tokens (as ``test_prompt_cache.kit`` builds them)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from services.common.model_dir import DEMO_MODEL_DIR
from tests.parse.support import TEMPLATE_FIXTURES


def families() -> list[str]:
    """Every fixture template family (tests/fixtures/chat_templates/manifest.json)."""
    return sorted(json.loads((TEMPLATE_FIXTURES / "manifest.json").read_text(encoding="utf-8"))["families"])


def build_family_model(family: str, dest: Path, max_model_len: int = 262_144) -> Path:
    """A loadable model directory at ``dest`` for ``family``'s chat template."""
    fam = TEMPLATE_FIXTURES / family
    meta = json.loads((fam / "reference" / "meta.json").read_text(encoding="utf-8"))
    special = json.loads((fam / "special_tokens.json").read_text(encoding="utf-8"))
    variables: dict[str, str] = meta["renders"][0]["template_variables_from_special_tokens"]
    tokenizer = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    controls = [*special.get("control_strings_in_template", []), *variables.values()]
    tokenizer.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in dict.fromkeys(controls)])
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(variables), encoding="utf-8")
    (dest / "config.json").write_text(json.dumps({"max_position_embeddings": max_model_len}), encoding="utf-8")
    (dest / "chat_template.jinja").write_text((fam / "chat_template.jinja").read_text(encoding="utf-8"),
                                              encoding="utf-8")
    return dest
