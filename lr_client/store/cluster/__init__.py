"""The site's cluster in the store: registered sites and members, leases of units
(:class:`Sites`, :class:`Members`)."""
