"""Ray orchestration: a controller actor per deployment, replica gangs in placement groups, lifecycle facts.

Modules: `spec` (desired state), `placement` (gang shape -> bundles), `lifecycle` (facts -> state),
`supervisor` (engine process groups that never outlive their owner), `node_actor` (one actor per node of a
replica), `router_link` (the router process and membership pushes), `controller` (the reconcile loop),
`bootstrap` (join or start Ray), `client` (create/find/remove deployments from a driver).
"""
