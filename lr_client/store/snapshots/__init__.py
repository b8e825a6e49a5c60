"""Full syncs in the store: requests and their lifecycle, the snapshot queue's entries and
the pool of slots holding them (:class:`SnapshotRequests`, :class:`SnapshotEntries`)."""
