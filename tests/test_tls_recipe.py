"""docs/tls.md's OpenSSL recipe makes certificates the mesh accepts: its commands, run as written (with this
machine's loopback names), give files that a mutual-TLS gRPC hop (``GrpcServer`` / ``open_channel``) serves
and calls with; a plaintext client of that server is refused."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from services.common.errors import InvalidRequestError
from services.common.grpc_util import GrpcServer, check_health, open_channel
from services.common.tls import TlsFiles

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).resolve().parents[1] / "docs" / "tls.md"


def recipe() -> list[str]:
    """The sh block's commands before `harnessmesh up`, for 127.0.0.1 / localhost."""
    block = re.search(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, "docs/tls.md lost its sh block"
    script = block.group(1).replace("\\\n", " ")
    lines = [line for line in script.splitlines() if line.strip() and not line.startswith("harnessmesh")]
    return [line.replace("IP:10.0.0.5,DNS:mesh-a", "IP:127.0.0.1,DNS:localhost") for line in lines]


@pytest.fixture
def made_by_the_recipe(tmp_path: Path) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    for line in recipe():
        subprocess.run(line, shell=True, cwd=tmp_path, check=True, capture_output=True, timeout=30)
    return tmp_path


async def test_the_documented_openssl_recipe_makes_working_certificates(made_by_the_recipe: Path) -> None:
    tmp_path = made_by_the_recipe
    tls = TlsFiles(str(tmp_path / "mesh.pem"), str(tmp_path / "mesh.key"), str(tmp_path / "ca.pem"))
    server = GrpcServer(None, "127.0.0.1", 0, tls)
    await server.start()
    try:
        secure = open_channel(server.address, None, tls)
        plain = open_channel(server.address, None)
        assert await check_health(secure, 3.0)
        assert not await check_health(plain, 1.0)
        await secure.close()
        await plain.close()
    finally:
        await server.stop(0)


def test_a_partial_tls_set_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="--tls-key"):
        TlsFiles(cert=str(tmp_path / "x.pem"), ca=str(tmp_path / "ca.pem")).check()
    with pytest.raises(InvalidRequestError, match="does not exist"):
        TlsFiles(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")).check()
    TlsFiles().check()  # none: plaintext
