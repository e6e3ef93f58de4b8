"""``harnessmesh breaks [LOG]``: the prefix breaks of a mesh's sessions and why each happened, from its log.

The parse service writes one ``parse.prefix_break`` line per break (JSON logs: ``harnessmesh up ... 2> mesh.log``,
or a container's log): where the session's new prompt stopped extending its previous turn, and the cause
(``services/parse/break_cause.py``) with the first message that differs. This command reads such a log
(``-``: standard input), keeps one session's breaks with ``--session`` (a prefix of the session key: a
trajectory's key is ``SESSION/TRAJECTORY``), prints one line per break and a count per cause; ``--json``
prints the breaks as JSON lines instead. Lines that are not JSON log records are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any, TextIO

EVENT = "parse.prefix_break"


def read_breaks(lines: Iterable[str], session: str = "") -> list[dict[str, Any]]:
    """The ``parse.prefix_break`` records among ``lines`` (of ``session`` and its trajectories, when given)."""
    found = []
    for line in lines:
        if EVENT not in line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or record.get("event") != EVENT:
            continue
        key = str(record.get("session_id", ""))
        if session and key != session and not key.startswith(session + "/"):
            continue
        found.append(record)
    return found


def causes(breaks: Iterable[dict[str, Any]]) -> Counter[str]:
    """How many breaks each cause explains."""
    return Counter(str(b.get("cause", "unknown")) for b in breaks)


def describe(record: dict[str, Any]) -> str:
    where = f"message #{record['message_index']} ({record.get('message_role') or '?'})" if int(
        record.get("message_index", -1)) >= 0 else "no message differs"
    return (f"{record.get('timestamp', '')} session {record.get('session_id', '')}: {record.get('cause', 'unknown')}"
            f", {where}, token {record.get('offset')} of {record.get('history_tokens')}"
            f"{' (in the output)' if record.get('in_output') else ''}\n"
            f"    was: {record.get('expected', '')!r}\n    now: {record.get('actual', '')!r}")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("breaks", help="show a session's prefix breaks and their causes (from a mesh log)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", nargs="?", default="-", help="the mesh's JSON log file ('-': standard input)")
    parser.add_argument("--session", default="", help="only this session's breaks (and its trajectories')")
    parser.add_argument("--json", action="store_true", help="print the breaks as JSON lines")


def run(ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    if ns.log == "-":
        breaks = read_breaks(sys.stdin, ns.session)
    else:
        with open(ns.log, encoding="utf-8", errors="replace") as log:
            breaks = read_breaks(log, ns.session)
    for record in breaks:
        print(json.dumps(record) if ns.json else describe(record), file=out)
    if not ns.json:
        counted = causes(breaks)
        summary = ", ".join(f"{cause} {n}" for cause, n in counted.most_common()) or "none"
        print(f"{len(breaks)} breaks: {summary}", file=out)
    return 0
