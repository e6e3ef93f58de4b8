"""Standing checks run with the suite: generated code current, ruff and mypy clean, import rules kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, check=False)


def test_generated_protobuf_code_is_current() -> None:
    done = run("-m", "services.api", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_clean() -> None:
    done = run("-m", "ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_mypy_clean() -> None:
    done = run("-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def test_import_rules_kept() -> None:
    """The package boundaries in pyproject.toml's ``[tool.importlinter]`` (which process may import which)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
         "--no-cache"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_layout_table_matches_the_tree() -> None:
    """Every path in docs/architecture.md's layout table exists, and every package with code is in the table."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    table = doc.split("## Layout", 1)[1].split("\n\n", 2)[1]
    cells = [row.split("|")[1].replace("`", "") for row in table.splitlines()[2:]]
    listed = {p.strip().rstrip("/").split("/{")[0] for cell in cells for p in cell.split(",")}
    for path in listed:
        assert (REPO / path).exists(), f"docs/architecture.md's layout names {path}, which is not in the tree"
    packages = {str(p.parent.relative_to(REPO)) for p in REPO.glob("services/*/__init__.py")}
    packages |= {"gateway"}
    assert packages <= listed | {"services/api"}, sorted(packages - listed)


PACKAGE_READMES = sorted([*REPO.glob("services/*/README.md"), REPO / "gateway" / "README.md"])


@pytest.mark.parametrize("readme", PACKAGE_READMES, ids=lambda p: str(p.parent.relative_to(REPO)))
def test_package_readme_maps_every_module_and_names_only_real_files(readme: Path) -> None:
    """Each package README names its one responsibility and lists each module; each path it names exists."""
    import re

    package = readme.parent
    text = readme.read_text()
    assert "responsibility" in text.lower(), f"{readme}: name the package's one responsibility"
    named = set(re.findall(r"`([\w/.]+\.py)`", text))
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if "_pb2" not in p.name}
    unlisted = {m for m in modules if not m.endswith("__init__.py") and m not in named
                and m.rsplit("/", 1)[-1] not in named}
    assert not unlisted, f"{readme}: modules missing from the file map: {sorted(unlisted)}"
    stale = {n for n in named if not (package / n).exists() and not (REPO / n).exists()
             and not any(m.endswith("/" + n) or m == n for m in modules)}
    assert not stale, f"{readme}: names files that do not exist: {sorted(stale)}"
