"""Cascaded clients in the store: a node's place, relayed queues, children's reports
(:class:`Cascading`, :class:`CascadeReports`)."""
