"""Test-only launcher: `tidelog serve` whose broker accepts transactional produce without a
transaction coordinator.

Usage (as a BrokerProcess prefix): ``python txn_unverified_serve.py <tidelog> serve ...``.
The partition-leader side of transactions (producer state, markers, LSO, aborted index,
read_committed Fetch) is tested over the wire before the coordinator exists: the tests
write transactional batches with Produce and end them with WriteTxnMarkers themselves.
Only KIP-890's verification is bypassed (every partition counts as added to the
producer's transaction); the partition's own checks still apply. Never used outside
tests/.
"""

from __future__ import annotations

import sys

from tidelog.broker.broker import Broker
from tidelog.cli.main import main
from tidelog.protocol import ErrorCode


class _EveryPartitionIsInTheTransaction:
    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        return ErrorCode.NONE


_VERIFIER = _EveryPartitionIsInTheTransaction()
# A class-level property wins over whatever verifier the broker's set-up installs.
Broker.transaction_verifier = property(  # type: ignore[assignment]
    lambda self: _VERIFIER, lambda self, value: None
)

if __name__ == "__main__":
    # argv[1] is the tidelog executable BrokerProcess would have run.
    sys.exit(main(sys.argv[2:]))
