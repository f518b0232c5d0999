"""``python -m sprite`` is the ``sprite`` command."""

from sprite.cli import main

main()
