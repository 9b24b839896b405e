"""A TLS certificate/key pair that does not load is named as such at start (gRPC alone fails to
bind, which read as a port problem). Certificates are made with the openssl command line."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.server import check_tls_pair


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command line is needed to make test certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("pems")
    for name in ("a", "b"):
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.pem",
                "-days",
                "1",
                "-subj",
                "/CN=x",
            ],
            cwd=d,
            check=True,
            capture_output=True,
        )
    (d / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    return d


def test_a_valid_pair_passes_and_a_broken_or_mismatched_one_names_both_files(pems):
    check_tls_pair(pems / "a.pem", pems / "a.key")
    for cert, key in (("junk.pem", "a.key"), ("a.pem", "b.key")):
        with pytest.raises(InvalidArgument, match=rf"{cert}.*{key}.*not a valid PEM pair"):
            check_tls_pair(pems / cert, pems / key)
