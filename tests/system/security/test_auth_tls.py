"""Bearer-token auth and TLS: the token guards every RPC but health; TLS refuses plaintext.

The certificates are made in the test with the ``openssl`` command line: a throwaway CA and a
server certificate for 127.0.0.1 / localhost signed by it.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import StoreUnavailable, Unauthenticated
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import self_signed

TOKEN = "tok-5f3a9c1e-not-a-real-secret"


def _server(**kw) -> BackgroundServer:
    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, auth_token=SecretStr(TOKEN), **kw)
    return BackgroundServer(lambda: create_store("memory", cfg.to_store_config()), cfg)


def _client(address: str, token: str | None = None, ca: Path | None = None) -> PriorityClient:
    settings = ClientSettings(server=address, auth_token=SecretStr(token) if token else None, tls_ca_file=ca, rpc_timeout_s=10)
    return PriorityClient(settings, max_retries=0)


def _health(channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_token_is_required_except_for_health(caplog):
    caplog.set_level(logging.DEBUG)
    with _server() as srv:
        for token in (None, "wrong-token", TOKEN + "x", TOKEN[:-1]):
            with _client(srv.address, token) as c, pytest.raises(Unauthenticated, match="bearer token"):
                c.stats()
        with _client(srv.address, "wrong") as c, pytest.raises(Unauthenticated):
            c.register([pb.Problem(id="a", prompt="p", answer="1")])  # client streaming is guarded too
        with _client(srv.address, TOKEN) as c:
            assert c.register([pb.Problem(id="a", prompt="p", answer="1")]).created == 1
            assert c.stats().problems == 1
        with grpc.insecure_channel(srv.address) as ch:  # health needs no token
            assert _health(ch) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(srv.address) as ch:  # a raw header that is not "Bearer <token>"
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.PriorityServiceStub(ch).GetStats(pb.GetStatsRequest(), timeout=5, metadata=(("authorization", TOKEN),))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metrics = srv.runtime.metrics.render().decode()
        assert 'code="UNAUTHENTICATED",method="GetStats"' in metrics
    assert TOKEN not in metrics
    assert TOKEN not in caplog.text


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 and localhost (EC P-256, 1 day)."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    self_signed(
        d,
        "ca.key",
        "ca.pem",
        "/CN=prioreplay test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        cwd=d,
    )
    return {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}


def test_tls_with_token_works_and_plaintext_is_refused(certs):
    with _server(tls_cert_file=certs["cert"], tls_key_file=certs["key"]) as srv:
        with _client(srv.address, TOKEN, ca=certs["ca"]) as c:
            assert c.register([pb.Problem(id="a", prompt="p", answer="1")]).total == 1
            lease = c.sample(1)
            assert [lp.problem.id for lp in lease.problems] == ["a"]
        with _client(srv.address, None, ca=certs["ca"]) as c, pytest.raises(Unauthenticated):
            c.stats()
        with _client(srv.address, TOKEN) as c, pytest.raises(StoreUnavailable):  # plaintext to a TLS port
            c.stats()
        # health over TLS needs no token; over plaintext it does not connect at all
        creds = grpc.ssl_channel_credentials(root_certificates=certs["ca"].read_bytes())
        with grpc.secure_channel(srv.address, creds) as ch:
            assert _health(ch) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(srv.address) as ch, pytest.raises(grpc.RpcError) as e:
            _health(ch)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_client_must_trust_the_ca(certs, tmp_path):
    """A client trusting another CA refuses the server's certificate."""
    self_signed(tmp_path, "other.key", "other.pem", "/CN=another CA")
    with _server(tls_cert_file=certs["cert"], tls_key_file=certs["key"]) as srv:
        with _client(srv.address, TOKEN, ca=tmp_path / "other.pem") as c, pytest.raises(StoreUnavailable):
            c.stats()


def test_tls_needs_cert_and_key_together(certs):
    with pytest.raises(ValueError, match="tls_cert_file and tls_key_file"):
        ServerConfig(tls_cert_file=certs["cert"])
