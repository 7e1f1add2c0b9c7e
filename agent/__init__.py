"""flexcomm.agent: the per-node policy agent (`flexcomm agent`).

One process per node serves the flexcomm.v1.Agent gRPC API (proto/) on a Unix
socket, holds one policy per registered job, feeds it the job's step reports and
the network as probed and as reported, and keeps everything in the store so a
restarted agent resumes each running job where it was. A job ends when its client
says so (EndJob) or sits idle past `job_idle_expiry_s`; its history stays in the
store. Nothing imports this package but the CLI.

    config.py    settings: defaults < TOML < FLEXCOMM_AGENT_* < flags
                 (requests are checked by flexcomm.proto.validate)
    jobs.py      per-job state: policy, versioned decision, counters, pending writes
    network_feed.py  the network model (flexcomm.probe.estimate) fed by probes and
                 reports; probes asked for when a job's syncs move; GetNetwork
    persist.py   the store, on its own thread: registration at once, the rest batched
    service.py   the RPC handlers, status codes, RPC metrics, ending a job
    probing.py   the probe scheduler over the jobs' nodes, and this node's iperf3 servers
    emulation.py an epoch-keyed emulation schedule advanced by reported epochs
    metrics.py   Prometheus metrics and /metrics
    sdnotify.py  systemd READY/WATCHDOG/STOPPING
    logs.py      JSON (or text) log lines
    server.py    start-up, serving loop, idle expiry, listeners, signals, shutdown; the
                 one place that wires the parts together (each is handed what it
                 uses, not the Agent)
"""
