from __future__ import annotations

from pathlib import Path

import pytest

from services.common.model_dir import load_model_dir
from services.worker.mocker.script import FillerText, FillerVocabulary, Script, ScriptError, filler_seed
from services.worker.mocker.stops import StopStringMatcher


def test_first_matching_line_wins(tmp_path: Path) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text('# comment\n{"match": "weather", "completion": "A"}\n\n{"match": "", "completion": "B"}\n')
    script = Script.load(f)
    assert script.lookup("what is the weather in Paris?").completion == "A"  # type: ignore[union-attr]
    assert script.lookup("hello").completion == "B"  # type: ignore[union-attr]
    assert Script.parse('{"match": "x", "completion": "y"}').lookup("z") is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"match": "a", "completion": "b"}\n{oops\n', "s.jsonl:2: not valid JSON"),
        ('["a"]\n', "s.jsonl:1: expected an object"),
        ('{"match": "a", "completion": 3}\n', "s.jsonl:1: 'match' and 'completion' must be strings"),
        ('{"match": "a", "completion": "b", "extra": 1}\n', "s.jsonl:1: unknown keys"),
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


def test_filler_is_deterministic_words_without_special_tokens() -> None:
    model = load_model_dir("")
    vocab = FillerVocabulary(model.tokenizer)
    a = FillerText(vocab, filler_seed([1, 2, 3], 0))
    b = FillerText(vocab, filler_seed([1, 2, 3], 0))
    c = FillerText(vocab, filler_seed([1, 2, 4], 0))
    ta, tb, tc = ([f.next() for _ in range(50)] for f in (a, b, c))
    assert ta == tb and ta != tc
    special = {model.tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "<think>")}
    assert not special & set(ta)
    text = model.tokenizer.decode(ta)
    assert text.replace(".", "").replace(" ", "").isalpha()


def _run_matcher(text: str, stops: list[str]) -> tuple[str, str]:
    tok = load_model_dir("").tokenizer
    ids = tok.encode(text, add_special_tokens=False).ids
    m = StopStringMatcher(tok, stops)
    out: list[int] = []
    for i in ids:
        out += m.push(i)
        if m.stop_string:
            break
    else:
        out += m.flush()
    return tok.decode(out), m.stop_string


def test_stop_string_excluded_and_reported() -> None:
    text, stop = _run_matcher("let me look first then run the tests", ["then"])
    assert stop == "then" and "then" not in text and text.startswith("let me look first")


def test_no_stop_releases_everything() -> None:
    text, stop = _run_matcher("let me look first", ["zebra"])
    assert stop == "" and text == "let me look first"


def test_multi_token_stop_string_is_held_back_until_resolved() -> None:
    tok = load_model_dir("").tokenizer
    ids = tok.encode("call tool</tool_call> more", add_special_tokens=False).ids
    m = StopStringMatcher(tok, ["tool_call> more"])
    released: list[int] = []
    for i in ids:
        released += m.push(i)
        if m.stop_string:
            break
    assert m.stop_string == "tool_call> more"
    assert "tool_call" not in tok.decode(released)
