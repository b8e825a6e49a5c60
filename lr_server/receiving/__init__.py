"""receiving."""
