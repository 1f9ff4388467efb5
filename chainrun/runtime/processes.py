"""Whether a process id names a live process (POSIX ``kill(pid, 0)``, see kill(2))."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """True when a process ``pid`` exists, also one of another user (``EPERM`` means it
    exists); a zombie still counts (its caller decides)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
