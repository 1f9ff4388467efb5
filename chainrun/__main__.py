"""``python -m chainrun`` runs the CLI."""

from chainrun.cli import main

main()
