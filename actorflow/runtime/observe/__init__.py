"""Watching runs: hooks and the test schedule, timelines, statistics, progress bars, the
deadlock detector."""
