"""phronomy.workflow."""
