"""``python -m lr_server.cli``: the ``lr`` command."""

from lr_server.cli import main

main()
