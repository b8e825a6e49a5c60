"""Retention: trim, drop and stop records, flow control, and the send queue's slots
(:class:`Retention`)."""
