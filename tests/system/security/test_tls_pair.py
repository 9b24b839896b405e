"""A TLS certificate/key pair that does not load is named as such at start (gRPC alone fails to
bind, which read as a port problem). Certificates are made with the openssl command line."""

from __future__ import annotations

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.server import check_tls_pair
from tests.conftest import self_signed


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    d = tmp_path_factory.mktemp("pems")
    for name in ("a", "b"):
        self_signed(d, f"{name}.key", f"{name}.pem", "/CN=x")
    (d / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    return d


def test_a_valid_pair_passes_and_a_broken_or_mismatched_one_names_both_files(pems):
    check_tls_pair(pems / "a.pem", pems / "a.key")
    for cert, key in (("junk.pem", "a.key"), ("a.pem", "b.key")):
        with pytest.raises(InvalidArgument, match=rf"{cert}.*{key}.*not a valid PEM pair"):
            check_tls_pair(pems / cert, pems / key)
