"""phronomy.agent."""
