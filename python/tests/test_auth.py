"""Token and TLS options: against the real server (`rollout serve` with --token-file and mTLS flags), and against a
grpc.aio server double in this process (named as such: it speaks the real RolloutService contract from the generated
stubs, but runs no rollouts) that records the metadata each call carried, to pin down exactly what the client sends:
`authorization: Bearer <token>`, TLS with a given root CA, a client certificate for mTLS. Certificates are made with
openssl at test time."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import grpc
import grpc.aio
import pytest

from rollout.v1 import rollout_pb2, rollout_pb2_grpc
from conftest import Server
from rollout_client import AsyncRolloutClient, RolloutClientError, TlsOptions

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificates")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("certs")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    for name in ("server", "client"):
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        ssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return d


class RolloutServiceDouble(rollout_pb2_grpc.RolloutServiceServicer):
    """TEST DOUBLE of the Rollout server: checks the bearer token, answers tasks with canned trajectories."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.seen_metadata: list = []

    async def Rollout(self, request_iterator, context):  # noqa: N802 - the generated servicer's name
        metadata = dict(context.invocation_metadata())
        self.seen_metadata.append(metadata)
        if metadata.get("authorization") != f"Bearer {self.token}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token required: authorization: Bearer <token>")
        async for request in request_iterator:
            kind = request.WhichOneof("kind")
            if kind == "open":
                yield rollout_pb2.RolloutResponse(opened=rollout_pb2.SessionOpened(session_id=request.open.session_id))
            elif kind == "task":
                spec = request.task
                yield rollout_pb2.RolloutResponse(accepted=rollout_pb2.TaskAccepted(task_id=spec.task_id, num_samples=spec.num_samples))
                for i in range(spec.num_samples):
                    t = rollout_pb2.Trajectory(
                        task_id=spec.task_id, sample_index=i, group_id=spec.group_id, status=rollout_pb2.TRAJECTORY_STATUS_COMPLETED,
                        prompt_token_ids=[1, 2], response_token_ids=[5, 6, 7], response_mask=[1, 1, 0], response_logprobs=[-0.5, -0.25, 0.0],
                        turns=[rollout_pb2.Turn(role=rollout_pb2.ROLE_ASSISTANT, start=0, end=2, policy_version=3), rollout_pb2.Turn(role=rollout_pb2.ROLE_TOOL, start=2, end=3)],
                        reward=float(i), num_turns=1,
                    )
                    yield rollout_pb2.RolloutResponse(trajectory=t)


async def serve(double, certs: Path, *, mtls: bool):
    server = grpc.aio.server()
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(double, server)
    creds = grpc.ssl_server_credentials(
        [((certs / "server.key").read_bytes(), (certs / "server.pem").read_bytes())],
        root_certificates=(certs / "ca.pem").read_bytes() if mtls else None,
        require_client_auth=mtls,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_the_token_goes_as_bearer_metadata_over_tls_verified_against_the_given_ca(certs):
    async def main():
        double = RolloutServiceDouble("s3cret")
        server, address = await serve(double, certs, mtls=False)
        try:
            tls = TlsOptions(root_certificates=certs / "ca.pem")  # a path; bytes work too
            async with AsyncRolloutClient(address, token="s3cret", tls=tls) as client:
                group = await asyncio.wait_for(client.run_group("math", {"problem": "?"}, 2), 30)
                assert [s.reward for s in group.samples] == [0.0, 1.0]
                assert group.samples[0].policy_versions == [3, 3, 0]
            assert double.seen_metadata[0]["authorization"] == "Bearer s3cret"
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_mtls_presents_the_client_certificate_and_a_client_without_one_is_refused(certs):
    async def main():
        double = RolloutServiceDouble("t")
        server, address = await serve(double, certs, mtls=True)
        try:
            tls = TlsOptions(root_certificates=(certs / "ca.pem").read_bytes(), certificate_chain=certs / "client.pem", private_key=certs / "client.key")
            async with AsyncRolloutClient(address, token="t", tls=tls) as client:
                group = await asyncio.wait_for(client.run_group("math", {}, 1), 30)
                assert len(group.samples) == 1
            calls = len(double.seen_metadata)
            async with AsyncRolloutClient(address, token="t", tls=TlsOptions(root_certificates=certs / "ca.pem")) as client:
                with pytest.raises(asyncio.TimeoutError):
                    await client.wait_connected(3)  # the handshake fails: the stream never opens
            assert len(double.seen_metadata) == calls
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_refused_token_fails_the_waiting_calls_instead_of_retrying_forever(certs):
    async def main():
        double = RolloutServiceDouble("right")
        server, address = await serve(double, certs, mtls=False)
        try:
            async with AsyncRolloutClient(address, token="wrong", tls=TlsOptions(root_certificates=certs / "ca.pem")) as client:
                with pytest.raises(RolloutClientError, match="UNAUTHENTICATED"):
                    await asyncio.wait_for(client.run_group("math", {}, 1), 30)
                with pytest.raises(RolloutClientError, match="UNAUTHENTICATED"):
                    await client.submit("math", {}, 1)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_tls_options_refuse_half_a_client_certificate():
    with pytest.raises(ValueError, match="certificate_chain and private_key"):
        TlsOptions(certificate_chain=b"x").credentials()


def test_the_real_server_with_a_token_and_mtls_serves_the_client_and_refuses_a_wrong_token(certs, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("real-s3cret\n")
    server = Server(extra_args=[
        "--token-file", str(token_file),
        "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
        "--tls-client-ca", str(certs / "ca.pem"), "--tls-require-client-cert",
    ])

    async def main():
        tls = TlsOptions(root_certificates=certs / "ca.pem", certificate_chain=certs / "client.pem", private_key=certs / "client.key")
        async with AsyncRolloutClient(server.address, token="real-s3cret", tls=tls) as client:
            group = await asyncio.wait_for(client.run_group("math", {"problem": "What is 2 + 3?", "answer": "5"}, 2), 120)
            assert len(group.samples) == 2
            assert all(not s.is_infra_failure for s in group.samples), [s.error for s in group.samples]
            assert all(len(s.response_ids) == len(s.loss_mask) == len(s.logprobs) > 0 for s in group.samples)
        async with AsyncRolloutClient(server.address, token="wrong", tls=tls) as client:
            with pytest.raises(RolloutClientError, match="UNAUTHENTICATED"):
                await asyncio.wait_for(client.run_group("math", {"problem": "1 + 1?", "answer": "2"}, 1), 60)

    try:
        asyncio.run(main())
    finally:
        server.stop()
