r"""Example pipeline: committed-only read -> transform or windowed count -> exactly-once write.

    python -m spark.example_pipeline --bootstrap 127.0.0.1:9092 --input txnstream-demo \\
        --output txnstream-demo-counts --checkpoint .txnstream/ckpt-demo

Runs one ``availableNow`` trigger (everything committed so far) and exits; run it again
to pick up from the checkpoint. Each window's count is written exactly once per batch.
"""

from __future__ import annotations

import argparse
import os
import sys


def _ensure_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            try:
                f.result(30)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise


def main(argv: list[str]) -> int:
    """Run one availableNow trigger of the pipeline."""
    ap = argparse.ArgumentParser(prog="python -m spark.example_pipeline")
    ap.add_argument("--bootstrap", default=os.environ.get("TXNSTREAM_BOOTSTRAP",
                                                          "127.0.0.1:9092"))
    ap.add_argument("--prefix", default=None, help="internal topic prefix")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--window", default="10 seconds")
    ap.add_argument("--mode", choices=("transform", "windowed"), default="transform",
                    help="transform: upper-case every committed value (default); windowed: "
                         "count per key and event-time window")
    args = ap.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter
    _ensure_topic(args.bootstrap, args.output)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark.txnstream_source import TxnStreamDataSource

    spark = (SparkSession.builder.master("local[2]").appName("txnstream-example")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.dataSource.register(TxnStreamDataSource)
    common = {"kafka.bootstrap.servers": args.bootstrap}
    if args.prefix:
        common["txnstream.prefix"] = args.prefix
    source = (spark.readStream.format("txnstream").options(**common, subscribe=args.input)
              .load())
    if args.mode == "windowed":
        # Append is the only output mode of Python stream writers: a window is written
        # once the watermark (max event time - window) has passed its end, i.e. after
        # newer records arrived; each window exactly once.
        out = (source.withWatermark("timestamp", args.window)
               .groupBy(F.window("timestamp", args.window), F.col("key")).count()
               .select(F.col("key"), F.to_json(F.struct(F.col("window.start").alias("start"),
                                                        F.col("count"))).alias("value")))
    else:
        out = source.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))
    query = (out.writeStream.format("txnstream")
             .options(**common, topic=args.output)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
