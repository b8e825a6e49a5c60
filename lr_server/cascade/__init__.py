"""Cascaded clients' control plane: reports up, the global watermark down."""
