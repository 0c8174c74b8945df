"""tidelog.replication: the replica of one partition as a sans-io state machine.

``replica`` holds :class:`~tidelog.replication.replica.Replica` (leader and follower rules:
fetch validation with DivergingEpoch, the high watermark, ISR changes, acks=all completion)
and ``log`` the :class:`~tidelog.replication.log.ReplicaLog` protocol, the part of
:class:`tidelog.storage.log.Log` it drives. Nothing here opens a socket, reads a clock or
starts a task: the broker (or the simulation in ``tidelog.testing.replication_sim``) feeds it
events with the time and carries out what it returns. See docs/replication.md.
"""
