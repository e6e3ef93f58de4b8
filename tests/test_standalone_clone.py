"""A fresh clone of the repository collects, and would run, the same tests whether or not ``../shared`` is there.

The developers' machines have a ``shared/`` folder beside the repository (chat templates, client captures,
traces); a user's clone does not. A test that reads it quietly turns into a skip or vanishes from the
collection when it is absent. This test clones the committed ``HEAD`` twice into a temporary folder, puts
``shared`` (a link to the real one) beside one clone only, and collects the suite in both at once. For
every test it records whether it is collected, and whether its ``skip`` / ``skipif`` marks skip it; a
module skipped at import counts as one entry. Both records must be equal. Without a ``../shared`` to
compare with, the reference is the working tree itself, when it is exactly ``HEAD`` (uncommitted files
are not in a clone).

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
SHARED = REPO.parent / "shared"

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


def test_a_clone_without_shared_collects_and_runs_the_same_tests(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "standalone_probe.py").write_text(PROBE)

    alone = tmp_path / "alone" / "harnessmesh"
    git("clone", "--quiet", str(REPO), str(alone), cwd=tmp_path)
    if SHARED.is_dir():
        reference_root = tmp_path / "beside-shared" / "harnessmesh"
        git("clone", "--quiet", str(REPO), str(reference_root), cwd=tmp_path)
        (reference_root.parent / "shared").symlink_to(SHARED, target_is_directory=True)
        reference_name = f"a clone with {SHARED} beside it"
    elif not git("status", "--porcelain", "--untracked-files=normal"):
        reference_root, reference_name = REPO, "the working tree (= HEAD)"
    else:
        pytest.skip(f"no {SHARED} to compare with, and the working tree is not HEAD (commit, then run again)")

    runs = [start_collection(alone, probe_dir, "alone"), start_collection(reference_root, probe_dir, "reference")]
    alone_seen, reference_seen = (finish_collection(*run) for run in runs)

    errors = {k: v for k, v in alone_seen.items() if v and v.startswith("collection error")}
    assert not errors, errors
    missing = sorted(set(reference_seen) - set(alone_seen))
    extra = sorted(set(alone_seen) - set(reference_seen))
    newly_skipped = {k: alone_seen[k] for k in sorted(set(alone_seen) & set(reference_seen))
                     if alone_seen[k] and not reference_seen[k]}
    assert not (missing or extra or newly_skipped), (
        f"a clone with no ../shared beside it differs from {reference_name}:\n"
        f"not collected: {missing[:20]} ({len(missing)})\nonly there: {extra[:20]} ({len(extra)})\n"
        f"skipped only there: {dict(list(newly_skipped.items())[:20])} ({len(newly_skipped)})"
    )
    assert len(alone_seen) > 100  # the whole suite was collected, not an early error
