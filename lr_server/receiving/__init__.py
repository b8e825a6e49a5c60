"""Receiving: the sink receiver that stores batches in receive queues, and its limits."""
