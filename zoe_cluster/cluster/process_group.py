"""Run one engine process so that it can never outlive its owner.

    python -m zoe_cluster.cluster.process_group --owner-pid PID -- ARGV...

The owner (a replica's node actor, or the controller for the router) starts this module in a new session and
the supervisor detaches (forks; the launcher exits at once), so it is not the owner's child: Ray kills an
exiting worker's direct children with SIGKILL, which would leave the engine behind with nobody to stop it. The
process group (id = the launcher's pid, a process that no longer exists) holds the supervisor, the engine and all
the engine's children. The supervisor writes the engine's pid to its pid file and polls the owner: when the owner
is gone (Ray killed the actor, the node actor crashed) it sends SIGTERM to the whole group, waits, then SIGKILL.
When the engine exits (or is killed by its pid), the supervisor writes the exit code to its exit file and exits.
`spawn_supervised` is the owner's side; it returns a `Supervised` handle with the engine's pid and the group's id.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.2


def _signal_reaches(send: Callable[[int, int], None], target: int) -> bool:
    """Whether signal 0 finds `target` (a pid for `os.kill`, a group for `os.killpg`); another user's counts."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(pid: int) -> bool:
    return _signal_reaches(os.kill, pid)


def group_alive(pgid: int) -> bool:
    return _signal_reaches(os.killpg, pgid)


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


def _live(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return _alive(pid) if not os.path.isdir("/proc") else False


@dataclass
class Supervised:
    """The owner's handle on one supervised engine: its process group, the supervisor's and the engine's pids, and
    its exit file. `kill engine_pid` ends the engine (the supervisor reports its exit); `kill -- -pgid` the group."""

    pgid: int
    supervisor_pid: int
    engine_pid: int | None
    """The engine process (the supervisor's child); None when it could not be started."""
    exit_file: Path

    def poll(self) -> int | None:
        """The engine's exit code; None while it runs; 137 when the supervisor itself was killed."""
        try:
            return int(self.exit_file.read_text())
        except (OSError, ValueError):
            pass
        if _live(self.supervisor_pid):
            return None
        try:  # it may have written the file just before exiting
            return int(self.exit_file.read_text())
        except (OSError, ValueError):
            return 128 + signal.SIGKILL

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the whole group (SIGTERM, SIGKILL after `grace_s`); returns the exit code and removes the files."""
        kill_group(self.pgid, grace_s)
        code = self.poll()
        shutil.rmtree(self.exit_file.parent, ignore_errors=True)
        return code

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"supervised process group {self.pgid} still running after {timeout_s}s")
            time.sleep(0.05)
        return code


def spawn_supervised(argv: list[str], env: dict[str, str], log_path: str | Path, owner_pid: int | None = None,
                     python: str | None = None) -> Supervised:
    """Start `argv` under a detached supervisor in a new process group, output appended to `log_path`."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="zoe-sup-"))
    pid_file, engine_pid_file, exit_file = run_dir / "pid", run_dir / "engine-pid", run_dir / "exit"
    cmd = [python or sys.executable, "-m", "zoe_cluster.cluster.process_group",
           "--owner-pid", str(owner_pid or os.getpid()), "--pid-file", str(pid_file), "--exit-file", str(exit_file),
           "--engine-pid-file", str(engine_pid_file), "--", *argv]
    with open(log_path, "ab") as log:
        launcher = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
    code = launcher.wait(timeout=60)  # exits as soon as the supervisor has forked away
    try:
        supervisor_pid = int(pid_file.read_text())
    except (OSError, ValueError):
        raise RuntimeError(f"supervisor did not start (launcher exit {code}); see {log_path}") from None
    handle = Supervised(pgid=launcher.pid, supervisor_pid=supervisor_pid, engine_pid=None, exit_file=exit_file)
    deadline = time.monotonic() + 60
    while handle.engine_pid is None and time.monotonic() < deadline:  # written right after the engine's fork
        try:
            handle.engine_pid = int(engine_pid_file.read_text())
        except (OSError, ValueError):
            if handle.poll() is not None:
                break  # the engine could not start (exit 127) or the supervisor died
            time.sleep(0.01)
    return handle


def _run(owner_pid: int, argv: list[str], grace_s: float, engine_pid_file: Path | None = None) -> int:
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
    if engine_pid_file is not None:
        tmp = engine_pid_file.with_suffix(".tmp")
        tmp.write_text(str(child.pid))
        tmp.rename(engine_pid_file)
    print(f"[zoe supervisor] pid {child.pid} started: {' '.join(argv)}", flush=True)
    owner_gone_at: float | None = None
    while True:
        code = child.poll()
        if code is not None:
            print(f"[zoe supervisor] engine exited with {code}", flush=True)
            return code if code >= 0 else 128 - code
        if owner_gone_at is None and not stopping and not _live(owner_pid):
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
    p.add_argument("--pid-file", type=Path, help="Detach: fork, write the supervisor's pid here, launcher exits.")
    p.add_argument("--exit-file", type=Path, help="Where the engine's exit code is written.")
    p.add_argument("--engine-pid-file", type=Path, help="Where the engine's pid is written once it started.")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        p.error("give the engine command after --")
    if a.pid_file is not None:
        pid = os.fork()
        if pid > 0:
            a.pid_file.write_text(str(pid))
            os._exit(0)
    code = _run(a.owner_pid, argv, a.grace_s, a.engine_pid_file)
    if a.exit_file is not None and not _live(a.owner_pid):  # nobody left to read it
        shutil.rmtree(a.exit_file.parent, ignore_errors=True)
    elif a.exit_file is not None:
        tmp = a.exit_file.with_suffix(".tmp")
        tmp.write_text(str(code))
        tmp.rename(a.exit_file)
    sys.exit(code)


if __name__ == "__main__":
    main()
