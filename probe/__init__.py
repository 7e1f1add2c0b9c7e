"""flexcomm.probe: measuring the network.

    iperf.py      bandwidth tests (iperf3 client and server)
    latency.py    TCP-connect round-trip times
    scheduler.py  when to probe whom, exclusively and within a duty-cycle budget
    serving.py    this node's iperf3 servers, on the addresses its peers reach it by
    addresses.py  this host's own addresses, and the one it reaches a peer from
    estimate.py   the network model: alpha and beta per path, and each job's
                  bottleneck, from the probes and from the job's own sync times
"""
