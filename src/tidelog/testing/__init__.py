"""tidelog.testing: the test kit shared by the tests and the simulations.

Modules: ``sim_disk`` (a Raft log and quorum-state file in memory that lose what was not flushed
when their node crashes), ``raft_sim`` (the deterministic simulation of the metadata quorum and
its invariant checker; ``python -m tidelog.testing.raft_sim --help``) and ``raft_mutants``
(Raft nodes with one rule broken on purpose, to prove the checker catches it);
``replication_sim`` and ``replication_mutants`` do the same for partition replication
(``python -m tidelog.testing.replication_sim --help``), over ``sim_disk.SimReplicaLog``;
``soak`` is the seed loop both simulations' command lines share. No production package imports
this one.
"""
