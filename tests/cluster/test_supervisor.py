"""Engine processes under the supervisor never outlive their owner, and stop as a whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.cluster.conftest import group_members, wait_for
from zoe_cluster.cluster.supervisor import kill_group, spawn_supervised

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
        wait_for(lambda: len(group_members(sup.pid)) == 3, 20, what="supervisor, engine and grandchild")
        assert os.getpgid(sup.pid) == sup.pid != os.getpgrp()  # its own group, not ours
        owner.kill()
        owner.wait()
        wait_for(lambda: not group_members(sup.pid), 15, what="the group to die with its owner")
        sup.wait(5)
        assert "owner" in (tmp_path / "e.log").read_text()
    finally:
        owner.kill()
        kill_group(sup.pid, 1)


def test_kill_group_stops_engine_and_grandchildren(tmp_path):
    sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log")
    wait_for(lambda: len(group_members(sup.pid)) == 3, 20, what="three processes")
    t = time.monotonic()
    kill_group(sup.pid, grace_s=5, reap=sup)
    assert not group_members(sup.pid) and time.monotonic() - t < 5
    assert "engine up" in (tmp_path / "e.log").read_text()


def test_stopped_engine_is_killed_after_the_grace(tmp_path):
    sup = spawn_supervised(ENGINE, dict(os.environ), tmp_path / "e.log")
    wait_for(lambda: len(group_members(sup.pid)) == 3, 20, what="three processes")
    os.killpg(sup.pid, signal.SIGSTOP)  # a hung engine ignores SIGTERM until continued
    kill_group(sup.pid, grace_s=0.5, reap=sup)
    wait_for(lambda: not group_members(sup.pid), 5, what="SIGKILL to reach the stopped group")


def test_engine_exit_code_passes_through(tmp_path):
    sup = spawn_supervised([sys.executable, "-c", "raise SystemExit(7)"], dict(os.environ), tmp_path / "e.log")
    assert sup.wait(20) == 7
    bad = spawn_supervised(["/nonexistent/engine"], dict(os.environ), tmp_path / "e.log")
    assert bad.wait(20) == 127
    assert "cannot start" in (tmp_path / "e.log").read_text()
