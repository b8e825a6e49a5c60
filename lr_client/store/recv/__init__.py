"""The receive side of the store: receive queues filled by the receiver, delivered by
subscribers, parked entries and replays (:class:`Receiving`, :class:`SubscriberQueues`,
:class:`QueueHeads`, :class:`QueuePartitions`, :class:`Replays`)."""
