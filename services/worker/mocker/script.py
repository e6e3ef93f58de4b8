"""What the mocker "generates": scripted completions picked by ``match_text``, else seeded filler text.

Script file (``--script FILE``): JSON lines ``{"match": "...", "completion": "..."}``. The first line
whose ``match`` is a substring of the request's ``match_text`` wins (an empty ``match`` matches
everything, so it works as a default). A line with ``"message": ["hi", "hello"]`` instead of ``match``
wins when one whole message equals one of them, case and surrounding whitespace and ``!.?`` ignored (a
greeting: as a substring, "hi" would match "this"). ``match_text`` is every user and tool message since the last
assistant message, separated by ``\x1e`` (so a ``match`` never spans two messages): a harness that
appends its own user message after the tool results (OpenClaw) still gets the tool results' line.
``completion`` is raw model text, tokenized with the model's tokenizer and followed by EOS. Blank
lines and lines starting with ``#`` are skipped.
Without ``--script`` the mocker uses the model directory's own ``mocker_script.jsonl`` when it has one
(:func:`script_for`): the demo model ships the script the README's examples show; ``--script`` replaces it.
The filler text and the token source live in ``services.kvcore.tokens`` (the replay simulator uses them too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MODEL_SCRIPT_NAME = "mocker_script.jsonl"  # a model directory's default script


class ScriptError(ValueError):
    """The script file cannot be read or a line is malformed (message names file and line)."""


@dataclass(frozen=True)
class ScriptEntry:
    """One scripted completion."""

    match: str
    completion: str
    line: int
    messages: frozenset[str] = frozenset()  # whole messages (normalised) that pick this line, instead of match

    def matches(self, match_text: str) -> bool:
        if self.messages:
            return any(_normalised(m) in self.messages for m in match_text.split(MESSAGE_SEPARATOR))
        return self.match in match_text


MESSAGE_SEPARATOR = "\x1e"  # between the messages of a request's match_text (services/parse/conversation.py)


def _normalised(message: str) -> str:
    return message.strip().rstrip("!.?").strip().casefold()


@dataclass(frozen=True)
class Script:
    """Scripted completions in file order."""

    entries: tuple[ScriptEntry, ...]
    path: str = ""

    @classmethod
    def load(cls, path: str | Path) -> Script:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScriptError(f"cannot read script {str(path)!r}: {exc}") from exc
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, path: str = "<script>") -> Script:
        entries = []
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ScriptError(f"{where}: not valid JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise ScriptError(f"{where}: expected an object with 'match' and 'completion'")
            match, completion, messages = obj.get("match", ""), obj.get("completion"), obj.get("message", [])
            if not isinstance(match, str) or not isinstance(completion, str):
                raise ScriptError(f"{where}: 'match' and 'completion' must be strings")
            if not isinstance(messages, list) or not all(isinstance(m, str) and m.strip() for m in messages):
                raise ScriptError(f"{where}: 'message' must be a list of non-empty strings")
            if messages and "match" in obj:
                raise ScriptError(f"{where}: give 'match' or 'message', not both")
            unknown = set(obj) - {"match", "message", "completion"}
            if unknown:
                raise ScriptError(f"{where}: unknown keys {sorted(unknown)}")
            entries.append(ScriptEntry(match, completion, lineno, frozenset(_normalised(m) for m in messages)))
        return cls(tuple(entries), path)

    def lookup(self, match_text: str) -> ScriptEntry | None:
        """The first entry whose ``match`` occurs in ``match_text`` (or one of whose ``message`` is a message)."""
        for entry in self.entries:
            if entry.matches(match_text):
                return entry
        return None


def script_for(path: str, model_dir: Path) -> Script | None:
    """The script a mocker uses: ``path`` (``--script``) when given, else ``model_dir``'s own
    ``mocker_script.jsonl`` when it has one, else none (filler text only)."""
    if path:
        return Script.load(path)
    default = model_dir / MODEL_SCRIPT_NAME
    return Script.load(default) if default.is_file() else None
