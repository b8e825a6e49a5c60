"""Sending: a sender session per destination, its pump rounds, window and acknowledgements,
full-sync requests, stops, replays and the shared reader of the send queue."""
