"""Ray orchestration: a controller actor per deployment, replica gangs in placement groups, lifecycle facts.

Modules: `spec` (desired state), `placement` (gang shape -> bundles), `lifecycle` (facts -> state),
`process_group` (an engine's process group that never outlives its owner), `node_actor` (one actor per node of a
replica), `replica_supervisor` (place, start, watch, drain, release each replica's gang), `router_link` (the
router process and its admin API), `membership_publisher` (who serves, pushed to every router), `fleet_load` (the
routers' load counts; the switcher's live fleet control), `intent_store` (the stored spec and generations),
`controller` (the actor's API and reconcile loop), `bootstrap` (join or start Ray), `client` (create/find/remove
deployments from a driver).
"""
