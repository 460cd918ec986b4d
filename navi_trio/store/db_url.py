"""A database URL as navi shows it: without its password.

Its own module, free of psycopg, because `navi doctor`, the factory and the PostgreSQL
store all show URLs (store/factory.py, store/postgres/_core.py).
"""

from __future__ import annotations

import urllib.parse


def describe(url: str) -> str:
    """A database URL without its password (in the user part or a ``password=`` parameter),
    for messages, logs and `navi doctor`."""
    parts = urllib.parse.urlsplit(url.strip())
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{hosts}" if user else hosts
    query = [
        (k, v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if k != "password"
    ]
    kept = urllib.parse.urlencode(query, safe="/")
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{kept}" if kept else "")
