"""The metadata loader: committed batches in, images and deltas out to the publishers.

Whatever commits metadata batches (today the single-node controller's commit path; with a
Raft quorum, the high watermark moving past them) hands them to :meth:`MetadataLoader.load`
in log order. The loader applies each to the current :class:`MetadataImage`, which yields
the next image and a :class:`MetadataDelta`, and calls every publisher with both, in the
order they were added, before :meth:`load` returns: whoever waits for a commit to answer a
request answers after every publisher has seen it.

Control batches (Raft's leader-change and snapshot markers) hold no metadata records: they
move the image's offset and epoch on and are not published. The image built so far always
carries the (offset, epoch) of the last batch loaded.

A snapshot (:meth:`MetadataLoader.load_snapshot`: at start, or when a lagging node installs
one fetched from the leader) replaces the image whole. Publishers are then told that
everything changed (:func:`~tidelog.metadata.image_records.snapshot_delta`), as Kafka's
publishers get a full image after a snapshot load, and committed batches continue from the
snapshot's end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.image_records import image_from_snapshot, snapshot_delta
from tidelog.metadata.log import MetadataBatch
from tidelog.metadata.records import MetadataRecord

__all__ = ["MetadataLoader", "Publisher"]

_log = logging.getLogger(__name__)

#: Told of each committed change: the new image and what changed from the previous one.
Publisher = Callable[[MetadataImage, MetadataDelta], None]


class MetadataLoader:
    """Builds the image from committed batches and publishes each change."""

    def __init__(self, image: MetadataImage) -> None:
        self._image = image
        self._publishers: list[Publisher] = []

    @property
    def image(self) -> MetadataImage:
        """The image as of the last batch loaded."""
        return self._image

    def add_publisher(self, publisher: Publisher) -> None:
        """Call ``publisher`` after every later change. A publisher added late gets no
        history: it starts from :attr:`image`."""
        self._publishers.append(publisher)

    def replay(self, batches: Iterable[MetadataBatch]) -> MetadataImage:
        """Load ``batches`` (a log read at start) as one change; the image they lead to.

        The records of every batch go through one replay and publishers are told once:
        replay copies each map it changes once in all, where loading batch by batch
        copies the topic indexes again for every batch that creates a topic (start-up
        time would grow with topics x batches). The result is the image loading them one
        by one gives; a batch that does not apply raises MetadataReplayError and leaves
        the image as it was.
        """
        records: list[tuple[int, MetadataRecord]] = []
        last: MetadataBatch | None = None
        for batch in batches:
            if last is not None:
                if batch.base_offset <= last.last_offset:
                    raise MetadataReplayError(
                        f"batch at offset {batch.base_offset} does not follow offset "
                        f"{last.last_offset}"
                    )
                if batch.epoch < last.epoch:
                    raise MetadataReplayError(
                        f"batch of epoch {batch.epoch} at offset {batch.base_offset} "
                        f"follows the later epoch {last.epoch}"
                    )
            if not batch.is_control:
                records.extend(batch.records)
            last = batch
        if last is None:
            return self._image
        image, delta = self._image, None
        if records:
            image, delta = image.apply(records, epoch=last.epoch)
        if image.offset < last.last_offset:
            # The run ends with control batches: they move the offset on, nothing else.
            image = image.advanced_to(last.last_offset, last.epoch)
        self._image = image
        if delta is not None:
            self._publish(image, delta)
        return image

    def load(self, batch: MetadataBatch) -> MetadataDelta | None:
        """Apply one committed batch and publish it; the delta (None for a control batch).

        A batch that does not apply raises MetadataReplayError and leaves the image as
        it was. A publisher that fails is logged and the others still run: the batch is
        committed whatever a listener makes of it.
        """
        image, delta = batch.apply_to(self._image)
        self._image = image
        if delta is None:
            return None
        self._publish(image, delta)
        return delta

    def load_snapshot(self, end_offset: int, epoch: int, records: Iterable[bytes]) -> MetadataDelta:
        """Replace the image with the one the snapshot ``(end_offset, epoch)`` holds and
        publish it; the delta publishers were given (everything in the snapshot changed).

        The new image carries offset ``end_offset - 1`` and ``epoch``: the next batch to
        load is the one at ``end_offset``. A snapshot that does not end after the image
        (an older one) is refused with MetadataReplayError, as is one that does not
        decode or replay; the image is then left as it was.
        """
        if end_offset - 1 <= self._image.offset:
            raise MetadataReplayError(
                f"snapshot ending at {end_offset} does not follow offset {self._image.offset}"
            )
        if epoch < self._image.epoch:
            raise MetadataReplayError(
                f"snapshot of epoch {epoch} follows the later epoch {self._image.epoch}"
            )
        image = image_from_snapshot(records, end_offset, epoch, cluster_id=self._image.cluster_id)
        delta = snapshot_delta(self._image, image)
        self._image = image
        self._publish(image, delta)
        return delta

    def _publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        for publisher in list(self._publishers):
            try:
                publisher(image, delta)
            except Exception:
                _log.exception("metadata publisher failed")
