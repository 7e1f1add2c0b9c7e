"""flexcomm.agent."""
