"""flexcomm.v1 generated messages and service stubs."""
