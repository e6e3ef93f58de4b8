"""Regenerate (or, with ``--check``, verify) the protobuf code in ``services/api``."""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
# Vendored third-party protos, each tree its own include root (sources and licences: its SOURCE.md); they
# are generated into the same package, under file names that do not clash with ours.
VENDORED_ROOTS = (PROTO_ROOT / "third_party" / "trtllm",)
PACKAGE_DIR = Path("services") / "api"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _plugin(name: str) -> str:
    """mypy-protobuf's protoc plugin ``name``: the one installed beside this interpreter (a venv's bin, whether
    or not that venv is on PATH), else the one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (mypy-protobuf) in this interpreter's environment")
    return found


def generate(out_root: Path) -> list[Path]:
    """Run protoc over every .proto file (ours and the vendored ones), writing generated modules under ``out_root``."""
    from grpc_tools import protoc

    for root in (PROTO_ROOT, *VENDORED_ROOTS):
        protos = sorted(str(p.relative_to(root)) for p in (root / PACKAGE_DIR).glob("*.proto"))
        args = [
            "protoc",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"-I{root}",
            f"--python_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--mypy_out={out_root}",
            f"--mypy_grpc_out={out_root}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    return sorted(p for p in (out_root / PACKAGE_DIR).iterdir() if p.name.endswith(SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m services.api", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    if not args.check:
        for path in generate(REPO):
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        current = {p.name: p for p in (REPO / PACKAGE_DIR).iterdir() if p.name.endswith(SUFFIXES)}
        stale = sorted(
            name
            for name in fresh.keys() | current.keys()
            if name not in fresh or name not in current or not filecmp.cmp(fresh[name], current[name], False)
        )
    if stale:
        print("generated protobuf code is stale, run `python -m services.api`: " + ", ".join(stale))
        return 1
    print("generated protobuf code is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
