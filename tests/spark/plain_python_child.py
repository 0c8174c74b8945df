"""A Spark job as a user writes it, run without PYSPARK_PYTHON: write rows to a topic through
``format("tidelog")`` and read them back through it.

Usage: plain_python_child.py BOOTSTRAP TOPIC ROWS
Prints the values read back, one a line. Only the tidelog source and sink run Python workers
(the rows come from ``spark.range``), so the job shows which interpreter they start.
"""

from __future__ import annotations

import sys


def main() -> None:
    bootstrap, topic, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from spark_helpers import local_session

    spark = local_session()
    (
        spark.range(rows)
        .selectExpr("cast(id as string) as key", "concat('value-', id) as value")
        .write.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    read = (
        spark.read.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .selectExpr("cast(value as string) as value")
        .collect()
    )
    for row in read:
        print(row.value)
    spark.stop()


if __name__ == "__main__":
    main()
