"""libpq connection service files (``pg_service.conf``), read as libpq reads them.

psycopg passes a ``service`` on to libpq but reads none of its settings itself: it
times a connection attempt out from ``connect_timeout`` in the DSN or
``PGCONNECT_TIMEOUT`` alone. A client that needs a service's setting before it
connects reads it here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["service_settings"]


def service_settings(params: Mapping[str, object]) -> dict[str, str]:
    """The settings of the service ``params`` names (its ``service``, else
    ``PGSERVICE``), from the first file defining it: ``PGSERVICEFILE`` (else
    ``~/.pg_service.conf``), then ``PGSYSCONFDIR/pg_service.conf``. Empty when no
    service is named or none of those files defines it: libpq then refuses the
    connection, saying why, or finds it in the system directory its build names,
    which is not known here without ``PGSYSCONFDIR``.
    """
    env = os.environ
    service = params.get("service") or env.get("PGSERVICE")
    if not service:
        return {}
    files = [Path(env.get("PGSERVICEFILE") or os.path.expanduser("~/.pg_service.conf"))]
    if "PGSYSCONFDIR" in env:
        files.append(Path(env["PGSYSCONFDIR"]) / "pg_service.conf")
    for file in files:
        found = _group(file, str(service))
        if found is not None:
            return found
    return {}


def _group(file: Path, service: str) -> dict[str, str] | None:
    """``[service]``'s ``key=value`` lines in ``file`` (the first of each key, as libpq
    keeps the first); None when the file or the group is missing."""
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    settings: dict[str, str] | None = None
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if settings is not None:
                break  # the group ended: libpq reads no later one of the same name
            if line.startswith(f"[{service}]"):
                settings = {}
        elif settings is not None:
            # libpq splits at the first "=" and trims nothing around it.
            key, sep, value = line.partition("=")
            if sep:
                settings.setdefault(key, value)
    return settings
