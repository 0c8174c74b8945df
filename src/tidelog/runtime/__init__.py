"""tidelog.runtime: what the rest of the code touches of the operating system, below every layer.

It imports nothing of tidelog, so that the server layers (storage, broker) and the client-side
programs (agent) can share it. Modules: ``filelock`` (a data directory owned by one process),
``system`` (the clock, random source and fsync a node's state machines are given:
:class:`~tidelog.runtime.system.Runtime`).
"""
