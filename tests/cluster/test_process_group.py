"""Engine processes under the process-group supervisor never outlive their owner, and stop as a whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.cluster.conftest import group_members, wait_for
from zoe_cluster.cluster.process_group import kill_group, spawn_supervised

# An "engine" that starts a grandchild (as vLLM starts its engine core) and sleeps.
ENGINE = [sys.executable, "-c",
          "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
          " print('engine up', flush=True); time.sleep(300)"]


def _owner() -> subprocess.Popen:
    """A stand-in owner process (the node actor) that we can kill -9."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])


def test_owner_death_takes_down_the_whole_engine_group(tmp_path):
    owner = _owner()
    try:
        sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log", owner_pid=owner.pid)
        wait_for(lambda: len(group_members(sup.pgid)) == 3, 20, what="supervisor, engine and grandchild")
        assert os.getpgid(sup.supervisor_pid) == sup.pgid != os.getpgrp()  # its own group, not ours
        # detached: not our child, so a Ray worker's exit (which SIGKILLs its children) cannot reach it
        assert int(open(f"/proc/{sup.supervisor_pid}/stat").read().rsplit(")", 1)[1].split()[1]) != os.getpid()
        owner.kill()
        owner.wait()
        wait_for(lambda: not group_members(sup.pgid), 15, what="the group to die with its owner")
        assert sup.poll() is not None
        assert "owner" in (tmp_path / "e.log").read_text()
    finally:
        owner.kill()
        kill_group(sup.pgid, 1)


def test_kill_group_stops_engine_and_grandchildren(tmp_path):
    sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log")
    wait_for(lambda: len(group_members(sup.pgid)) == 3, 20, what="three processes")
    t = time.monotonic()
    sup.stop(grace_s=5)
    assert not group_members(sup.pgid) and time.monotonic() - t < 5
    assert "engine up" in (tmp_path / "e.log").read_text()


def test_stopped_engine_is_killed_after_the_grace(tmp_path):
    sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log")
    wait_for(lambda: len(group_members(sup.pgid)) == 3, 20, what="three processes")
    os.killpg(sup.pgid, signal.SIGSTOP)  # a hung engine ignores SIGTERM until continued
    sup.stop(grace_s=0.5)
    wait_for(lambda: not group_members(sup.pgid), 5, what="SIGKILL to reach the stopped group")


def test_engine_exit_code_passes_through(tmp_path):
    sup = spawn_supervised([sys.executable, "-c", "raise SystemExit(7)"], dict(os.environ), tmp_path / "e.log")
    assert sup.wait(20) == 7 and sup.poll() == 7
    bad = spawn_supervised(["/nonexistent/engine"], dict(os.environ), tmp_path / "e.log")
    assert bad.wait(20) == 127
    assert "cannot start" in (tmp_path / "e.log").read_text()
    for handle in (sup, bad):
        handle.stop(grace_s=1)
        assert not handle.exit_file.parent.exists()


def test_a_killed_supervisor_reads_as_a_failure_and_its_group_still_stops(tmp_path):
    """Ray SIGKILLs an exiting worker's children; if that ever reaches the supervisor, the owner still sees a
    failure (exit 137) and stopping the group still kills the engine."""
    sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log")
    wait_for(lambda: len(group_members(sup.pgid)) == 3, 20, what="three processes")
    os.kill(sup.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: sup.poll() == 137, 5, what="the owner to see the supervisor gone")
    sup.stop(grace_s=1)
    assert not group_members(sup.pgid)


def test_the_handle_names_the_engine_pid_and_killing_it_ends_the_engine(tmp_path):
    """The launcher whose pid is the group id exits at once; the handle's `engine_pid` is the engine itself (what
    `zoe status` shows), so `kill PID` ends it and the owner sees the exit."""
    sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log")
    try:
        wait_for(lambda: len(group_members(sup.pgid)) == 3, 20, what="three processes")
        assert sup.pgid not in group_members(sup.pgid)  # the launcher is gone: its pid is only the group's id
        assert sup.engine_pid in group_members(sup.pgid) and sup.engine_pid != sup.supervisor_pid
        assert f"pid {sup.engine_pid} started" in (tmp_path / "e.log").read_text()
        os.kill(sup.engine_pid, signal.SIGKILL)
        wait_for(lambda: sup.poll() == 137, 10, what="the owner to see the engine's exit")
    finally:
        sup.stop(grace_s=1)
    assert not group_members(sup.pgid)
