"""The store's marker: a small file outside the store that says which store existed here.

A store that was deleted, truncated to 0 bytes, or swapped for another file starts empty: it
has forgotten which alerts were already acted on, so every resend from Alertmanager (which
keeps resending firing alerts) would act again. The marker names the store's id (written once
into its `meta` table); at start, a store that is missing, empty or has another id than the
marker refuses to start unless the operator says `--accept-new-store` (which then rewrites the
marker). Keep the marker out of the store's own backup/restore path, for example next to it
(`<store>.marker`, the default) or in the service's config directory (`store_marker_path`).
With PostgreSQL the store is a database (a dropped and re-created one is the reset to notice);
each replica keeps its own marker on its own host, all naming the same store id.
"""

from __future__ import annotations

import json
import os
import time

from trainwatch.remediation.config import Config
from trainwatch.remediation.store import Store
from trainwatch.remediation.stores import existing_store_id


class StoreResetError(RuntimeError):
    """The store is not the one the marker names; the message says what to do."""


def _what(config: Config, found: str | None) -> str:
    if found is not None:
        return f"is another store (id {found})"
    if config.postgresql is not None:
        return "has no Trainwatch tables (new, dropped or restored empty)"
    if not config.store_path.exists():
        return "is missing"
    return "is empty"


def check_store(config: Config, *, accept_new: bool) -> None:
    """Raise StoreResetError when a marker exists and the store is not the one it names."""
    marker = config.marker_path
    if not marker.exists() or accept_new:
        return
    try:
        recorded = json.loads(marker.read_text())
        expected = str(recorded["store_id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreResetError(f"marker {marker} is unreadable ({type(exc).__name__}); fix or "
                              "remove it, or start with --accept-new-store") from exc
    found = existing_store_id(config)
    if found == expected:
        return
    what = _what(config, found)
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(recorded.get("created", 0)))
    raise StoreResetError(
        f"store {config.store_location} {what}, but marker {marker} says store {expected} existed "
        f"here (since {since}). Starting would forget which alerts were already acted on and "
        "act on them again. Restore the store, or start once with --accept-new-store if a new "
        "store is intended.")


def write_marker(config: Config, store: Store) -> None:
    """Record the open store's id (atomically, mode 0600) unless the marker already names it.
    The store is checkpointed first, so its file is never empty once a marker names it."""
    marker = config.marker_path
    store_id = store.store_id()
    try:
        if json.loads(marker.read_text()).get("store_id") == store_id:
            return
    except (OSError, ValueError, AttributeError):
        pass
    store.checkpoint()
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f".{marker.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"store_id": store_id, "store_path": config.store_location,
                   "created": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, marker)
