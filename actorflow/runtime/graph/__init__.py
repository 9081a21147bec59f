"""Building an actor graph: the graph users describe (``ActorGraph``), what each actor
computes per act, sources, and the checks of what users give."""
