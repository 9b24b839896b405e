"""What the server says at start: where the memory store snapshots, an exposed port without a token."""

from __future__ import annotations

import logging

from pydantic import SecretStr

from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.server import _warn_about


def _messages(caplog, config: ServerConfig) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="prioreplay.server"):
        _warn_about(config)
    return [r.getMessage() for r in caplog.records]


def test_an_exposed_host_without_a_token_is_warned_about(caplog):
    exposed = _messages(caplog, ServerConfig(host="0.0.0.0", snapshot_path="s.json"))
    assert any("0.0.0.0 without a token" in m and "--auth-token-file" in m for m in exposed)
    assert not any("without a token" in m for m in _messages(caplog, ServerConfig(host="127.0.0.1")))
    guarded = ServerConfig(host="0.0.0.0", auth_token=SecretStr("t"), snapshot_path="s.json")
    assert not any("without a token" in m for m in _messages(caplog, guarded))


def test_the_snapshot_path_is_logged(caplog, tmp_path):
    assert any(str(tmp_path / "s.json") in m for m in _messages(caplog, ServerConfig(snapshot_path=tmp_path / "s.json")))
    assert any("without --snapshot-path" in m for m in _messages(caplog, ServerConfig()))
