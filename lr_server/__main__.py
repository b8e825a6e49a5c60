"""``python -m lr_server``: the ``lr`` command."""

from lr_server.cli import main

main()
