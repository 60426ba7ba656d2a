"""The replica state vocabulary: the one set of names for where a replica incarnation is in its life.

`zoe_cluster.cluster.lifecycle` derives a state from recorded facts; the switcher (`zoe_cluster.switching`) and
`zoe status` read the same names. The router's own per-replica bookkeeping (`router.replicas`) is not a state.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ACTIVE", "SERVING", "TERMINAL", "TRANSITIONING", "ReplicaState"]


class ReplicaState(str, Enum):
    PENDING = "pending"  # waiting for its placement group (GPUs) to be reserved
    STARTING = "starting"  # GPUs reserved; node actors and engine process starting
    LOADING = "loading"  # engine process running, /health not yet OK (loading weights, compiling)
    READY = "ready"  # /health OK: serving
    DRAINING = "draining"  # taken out of routing; finishing in-flight requests
    STOPPED = "stopped"  # stopped on purpose (scale down, swap, undeploy)
    FAILED = "failed"  # crashed, hung, or could not be placed/started

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def serving(self) -> bool:
        return self in SERVING


TERMINAL = frozenset({ReplicaState.STOPPED, ReplicaState.FAILED})
SERVING = frozenset({ReplicaState.READY})
ACTIVE = frozenset({ReplicaState.STARTING, ReplicaState.LOADING, ReplicaState.READY, ReplicaState.DRAINING})
TRANSITIONING = frozenset({ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.LOADING, ReplicaState.DRAINING})
"""On its way into or out of service (the switcher counts these as swaps in flight)."""
