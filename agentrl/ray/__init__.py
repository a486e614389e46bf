"""agentrl on Ray: env workers, policy replicas behind a router, and the clusters they run on.

The in-process asyncio path stays the default; this side is used only when a run asks for Ray
(`--ray local|auto|ADDRESS`). It imports `ray` lazily (inside functions and actor factories), so
`import agentrl` and `import agentrl.ray` stay light and work without the `ray` extra.

    cluster.py    connect to (or start) a cluster with token authentication; a loopback
                  cluster of `ray start` processes for tests and benches
    queue.py      the one task queue actor: leases groups to env workers, re-queues a dead
                  worker's leases
    env_worker.py the env worker actor: an EnvManager over its share of the episodes
    rollout.py    `RayRollout`, the driver side: the EnvManager interface over many workers
    replicas.py   policy replica actors, the router (least loaded, session affinity), the pool
                  that places, updates and restarts replicas
    policy.py     `RoutedPolicy`: the env workers' LLM policy, talking to replicas via the router
"""
