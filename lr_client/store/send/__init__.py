"""The send side of the store: the send log the application appends to, and what the
sender sessions read of it (the :class:`SendLog` and :class:`Shipping` roles)."""
