"""The last membership a router applied, kept in a file so a restarted router serves its replicas at once.

    save_membership(path, membership)      # after every applied push (written whole, then renamed into place)
    load_membership(path) -> Membership | None

A router started without membership reads the file (`RouterConfig.membership_file`); the controller's next push
replaces it as usual (versions still only go up, so an older push is refused as stale). What the file does not
hold: the prefix index and the load figures, which the router rebuilds from traffic and health checks.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import ValidationError

from zoe_cluster.config_errors import validation_problems
from zoe_cluster.router.membership import Membership

_log = logging.getLogger(__name__)


def save_membership(path: str | Path, membership: Membership) -> None:
    """Write `membership` to `path` atomically (a reader sees the old file or the new one, never half of one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(membership.model_dump_json())
    os.replace(tmp, path)


def load_membership(path: str | Path) -> Membership | None:
    """The membership saved at `path`; None when there is no file. A file that is not a valid membership is
    logged (naming the file and the fields) and ignored: the router then waits for a push."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return Membership.model_validate_json(text)
    except ValidationError as e:
        problems = validation_problems(e, whole="(file)")
        _log.error("membership file %s is not a valid membership (%s); waiting for a push", path, problems)
        return None
