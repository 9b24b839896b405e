"""Imports as prioreplay.priority_server.store.redis: the production store on Redis.

By concept: the key schema and value formats (:mod:`.keys`), the error taxonomy (:mod:`.errors`),
the connection and Sentinel discovery (:mod:`.connection`), the Lua scripts and their declared
arguments (:mod:`.scripts`, the files under ``lua/``), the plumbing every call goes through
(:mod:`.client`) and the store's operations (:mod:`.store`, :class:`RedisStore`).
"""

from .keys import KEY_NAMES
from .store import REGISTER_CHUNK, RedisStore

__all__ = ["KEY_NAMES", "REGISTER_CHUNK", "RedisStore"]
