"""Running a planned graph: the credit scheduler, the acts of timed, async and piped actors,
the run's output, stopping, state gates, the graph loop, ``run()``."""
