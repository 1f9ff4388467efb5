"""Analyses of run logs: summaries, comparisons, statistics, the hedge advisor and the
latency simulator."""
