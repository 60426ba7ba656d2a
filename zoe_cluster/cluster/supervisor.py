"""Run one engine process so that it can never outlive its owner.

    python -m zoe_cluster.cluster.supervisor --owner-pid PID -- ARGV...

The owner (a replica's node actor, or the controller for the router) starts this module in a new session, so
the supervisor leads its own process group and the engine and all the engine's children join it. The
supervisor polls the owner: when the owner is gone (Ray killed the actor, the node actor crashed) it sends
SIGTERM to the whole group, waits, then SIGKILL. When the engine exits, the supervisor exits with its code.
The owner stops everything with `kill_group(pgid)`, which reaches stragglers after the supervisor is gone.
`spawn_supervised` is the owner's side.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 10.0, reap: subprocess.Popen | None = None) -> None:
    """SIGTERM every process of group `pgid`, wait up to `grace_s` for the group to empty, then SIGKILL it."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap.poll()  # a zombie leader still counts as a member until reaped
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if reap is not None:
        try:
            reap.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def spawn_supervised(argv: list[str], env: dict[str, str], log_path: str | Path, owner_pid: int | None = None,
                     python: str | None = None) -> subprocess.Popen:
    """Start `argv` under a supervisor in a new process group (pgid == returned pid), output appended to `log_path`."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [python or sys.executable, "-m", "zoe_cluster.cluster.supervisor",
           "--owner-pid", str(owner_pid or os.getpid()), "--", *argv]
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _run(owner_pid: int, argv: list[str], grace_s: float) -> int:
    stopping = False

    def on_term(signum, frame):  # the group got SIGTERM: the child got it too; wait for it to finish
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        child = subprocess.Popen(argv)
    except OSError as e:
        print(f"[zoe supervisor] cannot start {argv[0]!r}: {e}", flush=True)
        return 127
    print(f"[zoe supervisor] pid {child.pid} started: {' '.join(argv)}", flush=True)
    owner_gone_at: float | None = None
    parent = os.getppid()
    while True:
        code = child.poll()
        if code is not None:
            print(f"[zoe supervisor] engine exited with {code}", flush=True)
            return code if code >= 0 else 128 - code
        if owner_gone_at is None and not stopping and (not _alive(owner_pid) or os.getppid() != parent):
            owner_gone_at = time.monotonic()
            print(f"[zoe supervisor] owner {owner_pid} is gone: stopping the engine's process group", flush=True)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(os.getpgrp(), signal.SIGTERM)
        if owner_gone_at is not None and time.monotonic() - owner_gone_at > grace_s:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # includes this process
        time.sleep(POLL_S)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--owner-pid", type=int, required=True)
    p.add_argument("--grace-s", type=float, default=10.0)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        p.error("give the engine command after --")
    sys.exit(_run(a.owner_pid, argv, a.grace_s))


if __name__ == "__main__":
    main()
