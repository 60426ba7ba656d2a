"""Recipe switching by concurrency: `decide` (pure) and the actuator the controller runs."""

from zoe_cluster.switching.decide import decide
from zoe_cluster.switching.predict import candidate_variants, replica_tok_s
from zoe_cluster.switching.vocabulary import ReplicaObservation, ServiceClass, SwitchConfig, SwitchDecision

__all__ = ["ReplicaObservation", "ServiceClass", "SwitchConfig", "SwitchDecision", "candidate_variants", "decide",
           "replica_tok_s"]
