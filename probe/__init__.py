"""flexcomm.probe."""
