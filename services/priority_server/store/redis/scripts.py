"""The Redis store's Lua scripts: where they are, which are followed by ``WAIT``, and their sources
(each ``lua/<name>.lua`` with the shared library ``lua/lib.lua`` prepended)."""

from __future__ import annotations

from pathlib import Path

#: The folder of the Lua files (shipped as package data).
LUA_DIR = Path(__file__).with_name("lua")
#: The store's scripts, each ``lua/<name>.lua``.
SCRIPT_NAMES = ("register", "sample", "report", "renew", "expire", "publish", "pull", "ack", "seen")
#: Scripts whose change a client is told is done: with ``min_replica_acks`` each is followed by WAIT.
#: (A lost lease of ``sample`` or a lost expiry changes nothing a client was promised: a report of
#: that lease is answered ``unknown lease``, the problems are leased again. A lost renewal leaves the
#: earlier deadline: the next renewal moves it again, or the lease expires as if its holder had died.)
WAITED_SCRIPTS = frozenset({"register", "report", "publish", "ack"})


def lua_library() -> str:
    """The shared Lua functions (``lua/lib.lua``) every script of the store is prefixed with."""
    return (LUA_DIR / "lib.lua").read_text(encoding="utf-8")


def load_scripts() -> dict[str, str]:
    """{script name: its source, ``lua/lib.lua`` prepended}."""
    lib = lua_library()
    return {n: lib + "\n" + (LUA_DIR / f"{n}.lua").read_text(encoding="utf-8") for n in SCRIPT_NAMES}


SCRIPTS = load_scripts()
