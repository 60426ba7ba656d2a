"""Recipe switching by concurrency: `decide` (pure) and the actuator the controller runs."""

from zoe_cluster.switching.decide import (
    ReplicaObservation,
    SwitchConfig,
    SwitchDecision,
    candidate_variants,
    decide,
    replica_tok_s,
)

__all__ = ["ReplicaObservation", "SwitchConfig", "SwitchDecision", "candidate_variants", "decide", "replica_tok_s"]
