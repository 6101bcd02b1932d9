"""phronomy: durable, resumable state-machine workflows and supervised executions for trio."""
