"""flexcomm.proto."""
