"""What operators read: ``lr status``, ``lr browse``, metrics over HTTP, ``/ready``, logs
and memory upkeep."""
