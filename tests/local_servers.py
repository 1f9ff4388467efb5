"""Local model servers in tests: stop only what the test started.

``chainrun local down`` (:func:`chainrun.runtime.local_model.down`) stops every server of
this install, whoever uses it: a developer's own replay on the same checkout lost its
model server to a test fixture's clean-up. A fixture stops only the servers of this
install that were not running when it began.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from chainrun.runtime import local_model


@contextlib.contextmanager
def stopping_only_what_starts_here() -> Iterator[None]:
    """On exit, stop the servers of this install that were not running on entry (a
    server already running, someone else's, is left alone)."""
    before = {s.pid for s in local_model.mine()}
    try:
        yield
    finally:
        for server in local_model.mine():
            if server.pid not in before:
                local_model.stop(server)


@contextlib.contextmanager
def local_server_in(home: Path) -> Iterator[local_model.LocalServer]:
    """The local model server of an install whose ``CHAINRUN_HOME`` is ``home`` (set for
    the block, then put back): started if none runs, stopped on exit only if started here."""
    old = os.environ.get("CHAINRUN_HOME")
    os.environ["CHAINRUN_HOME"] = str(home)
    try:
        with stopping_only_what_starts_here():
            yield local_model.up(quiet=True)
    finally:
        if old is None:
            os.environ.pop("CHAINRUN_HOME", None)
        else:
            os.environ["CHAINRUN_HOME"] = old
