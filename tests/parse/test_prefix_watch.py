"""PrefixWatch: a session's prompt must extend its previous prompt + output; breaks are located and reported."""

from __future__ import annotations

from services.parse.prefix_watch import PrefixWatch, session_key


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)


def run(watch: PrefixWatch, session: str, prompt: list[int], output: list[int]) -> None:
    turn = watch.begin(session, prompt)
    assert turn is not None
    turn.extend(output)
    turn.commit()


def test_extending_prompts_report_nothing() -> None:
    watch = PrefixWatch(decode)
    run(watch, "s", [1, 2, 3, 4], [5, 6])
    run(watch, "s", [1, 2, 3, 4, 5, 6, 7, 8], [9])
    run(watch, "s", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [])
    assert watch.breaks == []


def test_a_changed_header_is_reported_with_offset_and_text() -> None:
    watch = PrefixWatch(decode)
    run(watch, "s", [0, 1, 2, 3, 4, 5], [6, 7])
    run(watch, "s", [0, 1, 9, 3, 4, 5, 6, 7, 8], [])
    (report,) = watch.breaks
    assert (report.session, report.offset, report.history_tokens, report.in_output) == ("s", 2, 8, False)
    assert report.expected == "ab⟂cdefgh" and report.actual == "ab⟂jdefghi"


def test_a_rewritten_output_is_a_break_inside_the_output() -> None:
    watch = PrefixWatch(decode)
    run(watch, "s", [0, 1, 2], [3, 4])
    run(watch, "s", [0, 1, 2, 3, 9, 5], [])
    assert watch.breaks[0].offset == 4 and watch.breaks[0].in_output


def test_sessions_and_lines_are_separate() -> None:
    watch = PrefixWatch(decode, lines_per_session=2)
    run(watch, "a", [0, 1, 2], [3])
    run(watch, "b", [7, 8, 9], [3])  # another session: nothing to compare against
    assert watch.begin("", [1]) is None  # no session: not tracked
    run(watch, "a", [0, 1, 2, 3, 4], [])
    assert watch.breaks == []


def test_session_key_includes_the_trajectory() -> None:
    class Identity:
        session_id = "s"
        trajectory_id = "t"
        anonymous = False

    class MainLine(Identity):
        trajectory_id = "s"

    class MadeUp(Identity):
        anonymous = True

    assert session_key(Identity()) == "s/t"
    assert session_key(MainLine()) == "s"  # the session's main line of turns: the session itself
    assert session_key(MadeUp()) == ""  # an id the gateway made up: no earlier turn to compare with
