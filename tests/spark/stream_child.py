"""A streaming query in its own process (own SparkSession), for the kill -9 test.

Usage: stream_child.py BOOTSTRAP TOPIC OUTPUT_DIR CHECKPOINT_DIR MODE
MODE ``forever`` runs micro-batches until killed; ``available-now`` drains what is there and
exits. The query copies the topic to Parquet with the source's topic, partition and offset.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    bootstrap, topic, output, checkpoint, mode = sys.argv[1:6]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from spark_helpers import local_session

    spark = local_session()
    stream = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 400)
        .load()
        .select("topic", "partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
    )
    if mode == "available-now":
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime="200 milliseconds")
    query = stream.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
