"""An empty source is an error, not "registered 0 problem(s)" with exit 0."""

from __future__ import annotations

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.admin import run_load
from prioreplay.priority_server.config import LoadConfig


def test_an_empty_file_is_refused_with_the_source_named(memory_server, tmp_path):
    server = memory_server()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(InvalidArgument, match=r"empty\.jsonl: no problems in this source"):
        run_load(LoadConfig(source=str(empty), server=server.address))
    assert run_load(LoadConfig(source="arithmetic:2", server=server.address)) == 0
