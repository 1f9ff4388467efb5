"""Replaying a fixed request set through the chain as one run (kind ``replay``), and
resuming a replay that did not finish: :mod:`chainrun.replay.run`."""
