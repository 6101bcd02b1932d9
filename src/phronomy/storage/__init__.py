"""phronomy.storage."""
