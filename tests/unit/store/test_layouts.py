"""The records and replies Python and Lua exchange (store/redis/layouts.py) against their Lua side:
``lua/lib.lua`` declares each record's positions in a table (``local OUTCOME = { member = 1, ... }``)
that must equal the Python layout's, and no script reads a record by a bare number any more."""

from __future__ import annotations

import re

import pytest

from prioreplay.priority_server.store.redis import layouts, scripts
from prioreplay.priority_server.store.redis.layouts import LEASE, OUTCOME, SAME_REPLY, SAMPLE_REPLY, Layout


def lua_tables(source: str) -> dict[str, dict[str, int]]:
    """Every ``local NAME = { a = 1, b = 2 }`` of upper-case NAME in ``source``, by name."""
    out = {}
    for name, body in re.findall(r"^local ([A-Z_]+) = \{([^}]*)\}", source, re.M):
        out[name] = {k: int(v) for k, v in re.findall(r"([a-z_0-9]+) = (-?\d+)", body)}
    return out


def test_lib_lua_declares_every_record_layout_as_python_does():
    declared = lua_tables((scripts.LUA_DIR / "lib.lua").read_text(encoding="utf-8"))
    assert set(layouts.LUA_LAYOUTS) <= set(declared)
    for name, layout in layouts.LUA_LAYOUTS.items():
        assert declared[name] == layout.lua_table(), f"lib.lua's {name} differs from layouts.{name}"


def test_the_check_sees_a_field_added_on_one_side_only():
    grown = Layout("OUTCOME", (*OUTCOME.head, "extra"))
    declared = lua_tables((scripts.LUA_DIR / "lib.lua").read_text(encoding="utf-8"))
    assert declared["OUTCOME"] != grown.lua_table()


@pytest.mark.parametrize("script", ["report", "sample", "lib"])
def test_no_script_reads_a_lease_or_outcome_record_by_a_bare_position(script):
    """``f[2]`` / ``o[9]`` (the old positional reads) are gone: positions are named by the tables."""
    source = (scripts.LUA_DIR / f"{script}.lua").read_text(encoding="utf-8")
    assert re.findall(r"\b[fo]\[\d\]|outs\[j\]\[\d\]", source) == []


def test_a_packed_record_has_the_declared_fields_in_order_and_refuses_others():
    values = {f: i for i, f in enumerate(OUTCOME.head)}
    assert OUTCOME.pack(**values).split("\t") == [str(i) for i in range(len(OUTCOME.head))]
    with pytest.raises(TypeError, match="missing \\['evidence'\\]"):
        OUTCOME.pack(**{f: 0 for f in OUTCOME.head if f != "evidence"})
    with pytest.raises(TypeError, match="not declared \\['nope'\\]"):
        OUTCOME.pack(**values, nope=1)


def test_a_reply_reads_by_name():
    """A ``sample.lua`` answer of two problems, read through the layouts."""
    head = ["OK", "7", "3", "uri", "", "2", "0.25"]
    picks = [["m1", "1", "1 1 0 1 0.25", "{}", "0"], ["m2", "2", "2 2 2 2 5", "{}", "4"]]
    reply = head + picks[0] + picks[1] + ["100.5", "90.0"]
    assert reply[SAMPLE_REPLY.at("n")] == "2"
    assert [p["member"] for p in SAMPLE_REPLY.items(reply, 2)] == ["m1", "m2"]
    assert SAMPLE_REPLY.items(reply, 2)[1]["group_size"] == "4"
    assert SAMPLE_REPLY.tail_of(reply) == {"deadline": "100.5", "now": "90.0"}
    same = head + picks[0] + picks[1] + ["lease-1", "100.5", "90.0"]
    assert SAME_REPLY.tail_of(same)["lease_id"] == "lease-1"
    with pytest.raises(ValueError, match="fewer than 3 items"):
        SAMPLE_REPLY.items(reply, 3)


def test_a_lease_record_splits_into_its_items():
    record = "\t".join(["5", "123.5", "m1", "1", "0.25", "m2", "3", "4"])
    fields = record.split(LEASE.sep)
    assert LEASE.items(fields, 2) == [
        {"member": "m1", "source": "1", "score": "0.25"},
        {"member": "m2", "source": "3", "score": "4"},
    ]


def test_a_layout_refuses_a_field_named_twice():
    with pytest.raises(ValueError, match="named twice"):
        Layout("X", ("a", "b"), each=("a",))
