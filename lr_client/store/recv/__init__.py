"""recv."""
