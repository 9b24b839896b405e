"""Each Redis script's arguments are declared once (``store.redis.scripts.SCRIPT_ARGS``); the Lua
file's header comment lists the same KEYS and ARGV. An argument added on one side only fails here,
not in a run against Redis."""

from __future__ import annotations

import re

import pytest

from prioreplay.priority_server.store.redis.keys import KEY_NAMES
from prioreplay.priority_server.store.redis.scripts import LUA_DIR, MAX_ARGV, SCRIPT_ARGS, SCRIPT_NAMES, ScriptArgs

_HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.\.)?\]\s+(\S+)", re.M)
_READ = re.compile(r"ARGV\[(\d+)\]")


def _header(name: str, folder=LUA_DIR) -> tuple[list[str], list[str], str]:
    """(KEYS names, ARGV names, variadic tail name or "") of ``lua/<name>.lua``'s header comment."""
    keys: list[str] = []
    argv: list[str] = []
    rest = ""
    for kind, index, variadic, arg in _HEADER.findall((folder / f"{name}.lua").read_text(encoding="utf-8")):
        if variadic:
            assert kind == "ARGV" and not rest, f"{name}.lua: one variadic ARGV tail at most"
            assert int(index) == len(argv) + 1, f"{name}.lua: the tail ARGV[{index}...] must follow the last ARGV"
            rest = arg
            continue
        names = keys if kind == "KEYS" else argv
        assert int(index) == len(names) + 1, f"{name}.lua: {kind}[{index}] {arg} is out of order"
        names.append(arg)
    return keys, argv, rest


def test_every_script_is_declared():
    assert set(SCRIPT_ARGS) == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_declaration_matches_the_lua_header(name):
    spec = SCRIPT_ARGS[name]
    keys, argv, rest = _header(name)
    assert list(spec.keys) == keys, f"{name}.lua header KEYS {keys} != declared {list(spec.keys)}"
    assert list(spec.argv) == argv, f"{name}.lua header ARGV {argv} != declared {list(spec.argv)}"
    assert spec.rest == rest, f"{name}.lua header tail {rest!r} != declared {spec.rest!r}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_no_script_reads_a_positional_argv_slot_beyond_the_limit(name):
    code = "\n".join(
        line for line in (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("--")
    )
    slots = {int(i) for i in _READ.findall(code)}
    assert all(i <= MAX_ARGV for i in slots), f"{name}.lua reads ARGV{sorted(slots)}"
    assert all(i <= len(SCRIPT_ARGS[name].argv) for i in slots), f"{name}.lua reads an undeclared ARGV slot {sorted(slots)}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_declared_keys_are_keys_of_a_run(name):
    assert set(SCRIPT_ARGS[name].keys) <= set(KEY_NAMES) | {"parts"}


def test_a_call_must_name_exactly_the_declared_arguments():
    spec = ScriptArgs("toy", ("stats",), ("a", "b"))
    assert spec.arg_list(a=1, b=2) == [1, 2]
    with pytest.raises(TypeError, match="missing \\['b'\\]"):
        spec.arg_list(a=1)
    with pytest.raises(TypeError, match="not declared \\['c'\\]"):
        spec.arg_list(a=1, b=2, c=3)
    with pytest.raises(TypeError):
        spec.arg_list([9], a=1, b=2)  # no variadic tail declared
    with pytest.raises(ValueError, match="more than 10"):
        ScriptArgs("big", (), tuple(f"a{i}" for i in range(11)))


def test_the_header_parser_sees_a_one_sided_argument(tmp_path):
    """An ARGV added to a header only: the declaration no longer matches (the check above could fail)."""
    src = (LUA_DIR / "publish.lua").read_text(encoding="utf-8")
    (tmp_path / "publish.lua").write_text(src.replace("-- ARGV[2]  uri", "-- ARGV[2]  uri\n-- ARGV[3]  extra  new"))
    assert _header("publish", tmp_path)[1] == ["version", "uri", "extra"] != list(SCRIPT_ARGS["publish"].argv)
