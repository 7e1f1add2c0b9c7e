"""flexcomm.probe: measuring the network.

    iperf.py      bandwidth tests (iperf3 client and server)
    latency.py    TCP-connect round-trip times
    estimate.py   alpha and beta per peer from the measurements
    scheduler.py  when to probe whom, exclusively and within a duty-cycle budget
"""
