"""Helpers the tests share: agent processes, gloo ranks, namespaces, simulated jobs."""
