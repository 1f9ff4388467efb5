"""The run log: runs, turns, steps and calls in a database file; its schema, its writer
thread and its readers."""
