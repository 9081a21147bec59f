"""Planning a run's memory before its first act: piece specs, registers and budgets, the
plan's rows and sizing, lifetimes and placement of shared bytes, ``buffers="auto"``."""
