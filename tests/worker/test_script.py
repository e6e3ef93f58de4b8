from __future__ import annotations

from pathlib import Path

import pytest

from services.common.model_dir import DEMO_MODEL_DIR
from services.worker.mocker.script import MODEL_SCRIPT_NAME, Script, ScriptError, script_for


def test_first_matching_line_wins(tmp_path: Path) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text('# comment\n{"match": "weather", "completion": "A"}\n\n{"match": "", "completion": "B"}\n')
    script = Script.load(f)
    assert script.lookup("what is the weather in Paris?").completion == "A"  # type: ignore[union-attr]
    assert script.lookup("hello").completion == "B"  # type: ignore[union-attr]
    assert Script.parse('{"match": "x", "completion": "y"}').lookup("z") is None


def test_any_message_since_the_last_assistant_matches_but_no_match_spans_two() -> None:
    """``match_text`` holds every user/tool message since the last assistant turn, ``\x1e``-separated."""
    script = Script.parse('{"match": "exit code 0", "completion": "done"}\n{"match": "0\\nok", "completion": "x"}')
    openclaw_turn = "exit code 0\x1e[runtime context] cwd=/w"   # tool result, then the harness's own user message
    assert script.lookup(openclaw_turn).completion == "done"  # type: ignore[union-attr]
    assert Script.parse('{"match": "0ok", "completion": "x"}').lookup("code 0\x1eok") is None


def test_a_message_line_matches_a_whole_message_only() -> None:
    """``"message"``: a greeting matches the message "Hi!" but not "this" or "hi there" (no substring match)."""
    script = Script.parse('{"message": ["hi", "hello"], "completion": "greet"}\n{"match": "", "completion": "else"}')
    for greeting in ("hi", " Hi! ", "HELLO.", "tool output\x1ehello?"):
        assert script.lookup(greeting).completion == "greet", greeting  # type: ignore[union-attr]
    for other in ("this", "hi there", "philosophy", "hi\nthere", ""):
        assert script.lookup(other).completion == "else", other  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"match": "a", "completion": "b"}\n{oops\n', "s.jsonl:2: not valid JSON"),
        ('["a"]\n', "s.jsonl:1: expected an object"),
        ('{"match": "a", "completion": 3}\n', "s.jsonl:1: 'match' and 'completion' must be strings"),
        ('{"match": "a", "completion": "b", "extra": 1}\n', "s.jsonl:1: unknown keys"),
        ('{"message": "hi", "completion": "b"}\n', "s.jsonl:1: 'message' must be a list of non-empty strings"),
        ('{"message": [""], "completion": "b"}\n', "s.jsonl:1: 'message' must be a list of non-empty strings"),
        ('{"match": "a", "message": ["hi"], "completion": "b"}\n', "s.jsonl:1: give 'match' or 'message'"),
    ],
)
def test_bad_script_names_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text(text)
    with pytest.raises(ScriptError, match=needle):
        Script.load(f)


def test_missing_script_file(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="cannot read script"):
        Script.load(tmp_path / "nope.jsonl")


def test_without_script_the_model_directorys_own_is_used_and_script_replaces_it(tmp_path: Path) -> None:
    demo = script_for("", DEMO_MODEL_DIR)  # the demo model ships the README examples' script
    assert demo is not None and demo.path.endswith(MODEL_SCRIPT_NAME)
    assert demo.lookup("What is the weather in Paris?") is not None
    assert demo.lookup("Paris: 22 degrees, sunny") is not None
    assert demo.lookup("hi") is not None and demo.lookup("Hello!") is not None  # a greeting gets an answer
    assert demo.lookup("this and that") is None
    assert demo.lookup("word " * 100) is None  # no catch-all: other prompts get filler text
    own = tmp_path / "own.jsonl"
    own.write_text('{"match": "", "completion": "mine"}\n')
    replaced = script_for(str(own), DEMO_MODEL_DIR)
    assert replaced is not None and replaced.lookup("What is the weather in Paris?").completion == "mine"  # type: ignore[union-attr]
    assert script_for("", tmp_path) is None  # a model directory without one: filler only
