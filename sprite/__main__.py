"""``python -m sprite`` is the ``sprite`` command."""

from sprite.cli.app import main

main()
