"""The broker: a pure core (``core``, ``state``) and its socket loop (``server``)."""
