"""flexcomm.client."""
