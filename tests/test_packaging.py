"""The wheel `pip install .` builds carries everything `harnessmesh up` needs outside the repo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_wheel_carries_the_demo_model_and_generated_code(tmp_path: Path) -> None:
    # Build from the tracked files alone: a local *.egg-info (left by an editable install) would
    # otherwise add files the packaging configuration itself forgets.
    source = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True, capture_output=True, cwd=tmp_path,
    )
    (wheel,) = out.glob("harnessmesh-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "services/common/demo_model/tokenizer.json",
        "services/common/demo_model/tokenizer_config.json",
        "services/common/demo_model/chat_template.jinja",
        "services/common/demo_model/config.json",
        "services/common/demo_model/mocker_script.jsonl",  # the built-in demo script (README's first run)
        "services/common/demo_model/harnessmesh.json",  # its parsers: `harnessmesh up` needs no flags
        "services/api/chat_pb2.py",
        "services/launcher/cli.py",
        "gateway/__main__.py",
    ):
        assert needed in names, needed
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "harnessmesh = services.launcher.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
