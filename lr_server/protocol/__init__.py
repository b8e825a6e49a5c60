"""The wire protocol's version and its codecs (compressed batches)."""
