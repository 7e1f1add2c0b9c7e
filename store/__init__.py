"""flexcomm.store."""
