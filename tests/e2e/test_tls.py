"""``--tls-cert/--tls-key/--tls-ca``: the whole mesh over mutual TLS (every gRPC hop and NATS), with a CA this
test makes. A request is served end to end; a plaintext peer, or one whose certificate another CA signed, is
refused on the gRPC hops and on NATS; the harness edge (AgentService) takes TLS without a client certificate."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc
import httpx
import nats
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.certs import issue, make_ca
from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def serving(channel: grpc.aio.Channel) -> bool:
    """True when the health check over ``channel`` answers SERVING; False when the connection is refused."""
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    except grpc.aio.AioRpcError:
        return False
    finally:
        await channel.close()
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def nats_connects(url: str, token: str, context: ssl.SSLContext | None) -> bool:
    try:
        nc = await nats.connect(url, token=token, tls=context, connect_timeout=2, max_reconnect_attempts=0,
                                allow_reconnect=False)
    except Exception:  # nats-py raises several kinds (timeouts, SSL errors, "no servers available")
        return False
    await nc.close()
    return True


async def test_the_mesh_over_mutual_tls(tmp_path: Path) -> None:
    (tmp_path / "good").mkdir()
    (tmp_path / "rogue").mkdir()
    good = issue(tmp_path / "good", make_ca(tmp_path / "good"))
    rogue = issue(tmp_path / "rogue", make_ca(tmp_path / "rogue", "rogue CA"), "rogue")
    args = ["--workers", "1", "--speedup", "1000", "--served-model-name", "demo", "--log-level", "warning",
            *good.flags()]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
            reply = await http.post("/v1/chat/completions", json={
                "model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "hello over TLS"}]})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 8

        worker = mesh.workers[0]
        ca, cert, key = good.ca.read_bytes(), good.cert.read_bytes(), good.key.read_bytes()
        member = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        assert await serving(grpc.aio.secure_channel(worker, member))
        assert not await serving(grpc.aio.insecure_channel(worker))  # plaintext: refused
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca)
        assert not await serving(grpc.aio.secure_channel(worker, anonymous))  # TLS without a client certificate
        stranger = grpc.ssl_channel_credentials(root_certificates=ca, private_key=rogue.key.read_bytes(),
                                                certificate_chain=rogue.cert.read_bytes())
        assert not await serving(grpc.aio.secure_channel(worker, stranger))  # a certificate the CA did not sign

        assert await serving(grpc.aio.secure_channel(mesh.grpc, anonymous))  # the harness edge: server TLS only
        assert not await serving(grpc.aio.insecure_channel(mesh.grpc))

        trusted = ssl.create_default_context(cafile=str(good.ca))
        trusted.load_cert_chain(str(good.cert), str(good.key))
        assert await nats_connects(mesh.nats, mesh.nats_token, trusted)
        assert not await nats_connects(mesh.nats, mesh.nats_token, None)  # plaintext, even with the token
        untrusted = ssl.create_default_context(cafile=str(good.ca))
        untrusted.load_cert_chain(str(rogue.cert), str(rogue.key))
        assert not await nats_connects(mesh.nats, mesh.nats_token, untrusted)
