"""Keeping secrets out of logs and error messages: passwords in URLs and in free text.

The server logs its store URL and every configuration error quotes the values given; both go
through here, so a Redis password (``redis://:secret@host``, ``?password=secret``) never
reaches a log, a terminal or ``/metrics``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_REDACTED = "***"


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and error messages.

    Hides the password of the user-info part (``redis://user:secret@host`` →
    ``redis://user:***@host``, ``redis://:secret@host`` → ``redis://:***@host``) and the value of a
    ``password`` query parameter (or one ending in ``password``, e.g. ``sentinel_password``). A string that
    does not parse as a URL is replaced whole by
    ``<unparsable URL>`` (it might hold a secret).
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{_REDACTED}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower().endswith("password") for k, _ in pairs):  # also sentinel_password
            query = urlencode([(k, _REDACTED if k.lower().endswith("password") else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def hide_passwords(text: str) -> str:
    """``text`` with URL passwords (``scheme://user:PASSWORD@host``, ``?password=...``) replaced by ``***``."""
    text = re.sub(r"(?<=:)[^:@/\s]*(?=@)", "***", text)
    return re.sub(r"(?i)(password=)[^&\s'\"]*", r"\1***", text)
