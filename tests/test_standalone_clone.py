"""A fresh clone of the repository collects, and would run, the same tests as the working tree.

The developers' machines have reference material in a folder beside the repository (chat templates, client
captures, traces); a user's clone does not, and no test may read it (the data tests need is vendored under
``tests/``, its source noted). A test that read it would quietly turn into a skip or vanish from the
collection in a lone clone. This test clones the committed ``HEAD`` into a temporary folder with nothing
beside it and collects the suite there and in the working tree (which must be exactly ``HEAD``: uncommitted
files are not in a clone) at once. For every test it records whether it is collected, and whether its
``skip`` / ``skipif`` marks skip it; a module skipped at import counts as one entry. Both records must be
equal. A second test checks the source: no test module names the sibling folder.

Collection only, so it takes about as long as one ``pytest --collect-only`` (~15-30 s here); skips that
happen inside a test's body are not seen (they are few and name what they need: a client, PyTorch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The sibling folder of reference material, spelled in pieces so this module does not name it either.
SIBLING_NAMES = ("/".join(("..", "sha" + "red")), '"sha' + 'red"')

pytestmark = [pytest.mark.standalone, pytest.mark.timeout(300)]

# Loaded into each collection (-p): writes {node id: skip reason, or null when it would run} to a file.
PROBE = '''
import json, os

_seen = {}


def pytest_collectreport(report):
    if report.skipped:  # a module skipped at import (pytest.importorskip, pytest.skip(allow_module_level=True))
        _seen[report.nodeid] = "module skipped: " + str(report.longrepr)
    elif report.failed:
        _seen[report.nodeid] = "collection error: " + str(report.longrepr)[-500:]


def _skip_reason(item):
    for mark in item.iter_markers("skip"):
        return mark.kwargs.get("reason") or (mark.args[0] if mark.args else "skip")
    for mark in item.iter_markers("skipif"):
        conditions = mark.args or ((mark.kwargs["condition"],) if "condition" in mark.kwargs else ())
        if any(c for c in conditions if not isinstance(c, str)):
            return mark.kwargs.get("reason") or "skipif"
    return None


def pytest_collection_finish(session):
    for item in session.items:
        _seen[item.nodeid] = _skip_reason(item)
    with open(os.environ["STANDALONE_PROBE_OUT"], "w") as out:
        json.dump(_seen, out, sort_keys=True)
'''


def git(*argv: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", "-c", f"safe.directory={REPO}", *argv], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout


def start_collection(root: Path, probe_dir: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    out = probe_dir / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(probe_dir), "STANDALONE_PROBE_OUT": str(out)}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-p", "standalone_probe"], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, out


def finish_collection(proc: subprocess.Popen[str], out: Path) -> dict[str, str | None]:
    output, _ = proc.communicate(timeout=240)
    assert out.is_file(), f"the collection wrote no record (exit {proc.returncode}):\n{output[-3000:]}"
    seen: dict[str, str | None] = json.loads(out.read_text())
    return seen


def test_a_lone_clone_collects_and_runs_the_same_tests(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    if git("status", "--porcelain", "--untracked-files=normal"):
        pytest.skip("the working tree is not HEAD (commit, then run again)")
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "standalone_probe.py").write_text(PROBE)
    alone = tmp_path / "alone" / "harnessmesh"
    git("clone", "--quiet", str(REPO), str(alone), cwd=tmp_path)

    runs = [start_collection(alone, probe_dir, "alone"), start_collection(REPO, probe_dir, "reference")]
    alone_seen, reference_seen = (finish_collection(*run) for run in runs)

    errors = {k: v for k, v in alone_seen.items() if v and v.startswith("collection error")}
    assert not errors, errors
    missing = sorted(set(reference_seen) - set(alone_seen))
    extra = sorted(set(alone_seen) - set(reference_seen))
    newly_skipped = {k: alone_seen[k] for k in sorted(set(alone_seen) & set(reference_seen))
                     if alone_seen[k] and not reference_seen[k]}
    assert not (missing or extra or newly_skipped), (
        "a lone clone differs from the working tree:\n"
        f"not collected: {missing[:20]} ({len(missing)})\nonly there: {extra[:20]} ({len(extra)})\n"
        f"skipped only there: {dict(list(newly_skipped.items())[:20])} ({len(newly_skipped)})"
    )
    assert len(alone_seen) > 100  # the whole suite was collected, not an early error


def test_no_test_module_names_the_sibling_reference_folder() -> None:
    offenders = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("*.py")
                       if any(name in path.read_text(encoding="utf-8") for name in SIBLING_NAMES))
    assert not offenders, f"these test modules name the reference folder beside the repository: {offenders}"
