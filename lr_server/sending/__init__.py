"""sending."""
