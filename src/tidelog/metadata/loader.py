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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.log import MetadataBatch

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
        """Load ``batches`` (a log read at start); the image they lead to."""
        for batch in batches:
            self.load(batch)
        return self._image

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
        for publisher in list(self._publishers):
            try:
                publisher(image, delta)
            except Exception:
                _log.exception("metadata publisher failed")
        return delta
