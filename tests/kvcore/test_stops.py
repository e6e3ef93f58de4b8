from __future__ import annotations

from services.common.model_dir import load_model_dir
from services.kvcore.stops import StopStringMatcher


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
