"""Imports as prioreplay.priority_server.store: the store, where a run's state lives.

The contract (:mod:`.base`, its semantics in that module's docstring) and its records
(:mod:`.records`), the helpers both stores share (:mod:`.contract`), the in-process store
(:mod:`.memory_store`, with :mod:`.snapshot` for its file) and the Redis store (:mod:`.redis`:
keys, errors, connection, scripts and the Lua files). The contract's names are re-exported here.
"""

from ..config import StoreConfig
from .base import Store
from .contract import (
    EXPIRE_LIMIT,
    FIXED_SETTINGS,
    MAX_NAMED_CONFLICTS,
    MAX_REQUEST_KEY_BYTES,
    RENAMED_RUN_SETTINGS,
    RUN_SETTINGS,
    TIE_HEX_CHARS,
    TOMBSTONE_TTL_S,
    QueueWatch,
    conflict_error,
    histogram_edges,
    member_id,
    renew_refusal,
    run_settings,
    same_text,
    setting_changes,
    tie_member,
)

__all__ = [
    "EXPIRE_LIMIT",
    "FIXED_SETTINGS",
    "MAX_NAMED_CONFLICTS",
    "MAX_REQUEST_KEY_BYTES",
    "RENAMED_RUN_SETTINGS",
    "RUN_SETTINGS",
    "TIE_HEX_CHARS",
    "TOMBSTONE_TTL_S",
    "QueueWatch",
    "Store",
    "StoreConfig",
    "conflict_error",
    "histogram_edges",
    "member_id",
    "renew_refusal",
    "run_settings",
    "same_text",
    "setting_changes",
    "tie_member",
]
