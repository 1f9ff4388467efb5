"""How to go on with a replay that did not finish, as one command line (stdlib only: the
CLI's ``runs`` lists these without loading the chain or its config)."""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["resume_command"]


def resume_command(source: str | Path, db: str | Path, run_id: int) -> str:
    """The command that runs the rest of replay run ``run_id`` of the replay file
    ``source`` in the log ``db``, quoted for a POSIX shell (:func:`shlex.join`): what
    every message about an unfinished replay tells the user to run, ``--db`` included
    (the log may not be the default one)."""
    return shlex.join(["chainrun", "replay", str(source), "--db", str(db),
                       "--resume", str(run_id)])  # fmt: skip
