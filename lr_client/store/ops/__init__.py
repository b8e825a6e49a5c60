"""Read-only views for operators: status, browsing, metrics (:class:`Inspection`)."""
