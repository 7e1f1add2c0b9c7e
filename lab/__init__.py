"""flexcomm.lab."""
