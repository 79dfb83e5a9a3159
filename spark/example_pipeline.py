r"""Example pipeline: committed-only read -> transform or windowed count -> exactly-once write.

    python -m txnstream_spark.example_pipeline --bootstrap 127.0.0.1:9092 --input txnstream-demo \\
        --output txnstream-demo-counts --checkpoint .txnstream/ckpt-demo

Reads everything committed so far and exits (transform: one ``availableNow`` run;
windowed: micro-batches until idle, so the watermark closes windows); run it again to
pick up from the checkpoint. Each window's count is written exactly once per batch.
``--with-worker`` runs a coordinator worker in-process for the run (the demo does);
otherwise ``txnstream worker`` must be running. ``--check`` reads the output back,
committed-only, and prints what was written (``make demo`` uses both, windowed).

The coordinator line's credentials come from the environment as everywhere
(``TXNSTREAM_TC_PRINCIPAL``, ``TXNSTREAM_TC_SECRET`` or ``_SECRET_FILE``,
``TXNSTREAM_TC_TLS_*``; ``Config.from_env``) or ``--tc-secret-file``; they reach the source
and sink as their ``tc.*`` options (a secret file as ``tc.secretFile``, read by the driver).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from txnstream.config import Config
    from txnstream.coordinator.worker import CoordinatorWorker


def _ensure_topic(bootstrap: str, topic: str, kafka: dict[str, str],
                  partitions: int = 3) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **kafka})
    if topic not in admin.list_topics(timeout=10).topics:
        for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            try:
                f.result(30)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise


def main(argv: list[str]) -> int:
    """Run one availableNow trigger of the pipeline."""
    ap = argparse.ArgumentParser(prog="python -m txnstream_spark.example_pipeline")
    ap.add_argument("--bootstrap", default=os.environ.get("TXNSTREAM_BOOTSTRAP",
                                                          "127.0.0.1:9092"))
    ap.add_argument("--prefix", default=None, help="internal topic prefix")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--window", default="10 seconds", help="event-time window (windowed)")
    ap.add_argument("--watermark", default=None,
                    help="how late a record may come (windowed; default: --window)")
    ap.add_argument("--kafka-config", default=os.environ.get("TXNSTREAM_KAFKA_CONFIG"),
                    help="librdkafka settings file (SASL/TLS), passed as kafka.* options")
    ap.add_argument("--tc-secret-file", default=None,
                    help="the coordinator line's secret, in a file (default: "
                         "$TXNSTREAM_TC_SECRET or $TXNSTREAM_TC_SECRET_FILE)")
    ap.add_argument("--max-records-per-trigger", type=int, default=None,
                    help="cap each micro-batch (the source's maxRecordsPerTrigger)")
    ap.add_argument("--master", default=None,
                    help="Spark master (default: what spark-submit set, else local[2])")
    ap.add_argument("--with-worker", action="store_true",
                    help="run a coordinator worker in this process for the run")
    ap.add_argument("--check", action="store_true",
                    help="read the output back (committed-only) and print a check")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="keep Spark's own logging (WARN and above) and progress bar; "
                         "without it a local run logs Spark's errors only")
    ap.add_argument("--mode", choices=("transform", "windowed"), default="transform",
                    help="transform: upper-case every committed value (default); windowed: "
                         "count per key and event-time window")
    args = ap.parse_args(argv)
    # Under spark-submit the master and the executors' Python come from its flags and
    # conf; run as a plain script, local[2] executors run this interpreter.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    if not submitted:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    # By its installed name: spark-submit runs this file as a script, outside the package
    # (mypy checks spark/ as the package ``spark``, so it cannot follow this name).
    from txnstream_spark.datasource import (  # type: ignore[import-not-found]
        TxnStreamDataSource,
    )

    builder = SparkSession.builder.appName("txnstream-example")
    if args.master or not submitted:  # else spark-submit's --master and --conf hold
        builder = (builder.master(args.master or "local[2]")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1"))
        if not args.verbose:  # before the JVM starts: its start-up warnings too
            builder = (builder.config("spark.driver.extraJavaOptions",
                                      f"-Dlog4j2.configurationFile={_quiet_log4j()}")
                       .config("spark.ui.showConsoleProgress", "false"))
    spark = builder.getOrCreate()
    spark.dataSource.register(TxnStreamDataSource)
    from txnstream.config import Config, TopicNames, load_kafka_properties, read_secret_file

    kafka = load_kafka_properties(args.kafka_config) if args.kafka_config else {}
    overrides: dict[str, Any] = {"kafka": kafka}
    if args.prefix:
        overrides["topics"] = TopicNames(args.prefix)
    # As Config.from_env: TXNSTREAM_TC_SECRET wins over TXNSTREAM_TC_SECRET_FILE.
    secret_file = args.tc_secret_file or (None if os.environ.get("TXNSTREAM_TC_SECRET")
                                          else os.environ.get("TXNSTREAM_TC_SECRET_FILE"))
    if args.tc_secret_file:
        overrides["tc_secret"] = read_secret_file(args.tc_secret_file, "--tc-secret-file")
    config = Config.from_env(args.bootstrap, **overrides)
    common = {"kafka.bootstrap.servers": args.bootstrap,
              **{f"kafka.{k}": v for k, v in kafka.items()},
              "txnstream.prefix": config.topics.prefix, **_line_options(config, secret_file)}
    _ensure_topic(args.bootstrap, args.output, kafka)
    # every input record, as the pipeline has always read (a stream's default is latest)
    reader = spark.readStream.format("txnstream").options(**common, subscribe=args.input,
                                                          startingOffsets="earliest")
    if args.max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(args.max_records_per_trigger))
    source = reader.load()
    if args.mode == "windowed":
        # Append is the only output mode of Python stream writers: a window is written
        # once the watermark (max event time - window) has passed its end, i.e. after
        # newer records arrived; each window exactly once.
        out = (source.withWatermark("timestamp", args.watermark or args.window)
               .groupBy(F.window("timestamp", args.window), F.col("key")).count()
               .select(F.col("key"), F.to_json(F.struct(F.col("window.start").alias("start"),
                                                        F.col("count"))).alias("value")))
    else:
        out = source.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))
    worker = _start_worker(config) if args.with_worker else None
    try:
        writer = (out.writeStream.format("txnstream").options(**common, topic=args.output)
                  .option("checkpointLocation", args.checkpoint))
        if args.mode == "windowed":
            # availableNow runs no batch after the last data, so windows the final
            # watermark closes would wait for the next run: micro-batches every second
            # instead, until no input came for a few batches.
            _run_until_idle(writer.trigger(processingTime="1 second").start())
        else:
            writer.trigger(availableNow=True).start().awaitTermination()
        spark.stop()
        ok = _check(config, args.output, args.mode) if args.check else True
    finally:
        if worker is not None:
            worker.stop()
    return 0 if ok else 1


def _quiet_log4j() -> str:
    """The path of the packaged Log4j 2 configuration that logs Spark's errors only."""
    return str(Path(__file__).with_name("log4j2-quiet.properties"))


def _line_options(config: Config, secret_file: str | None) -> dict[str, str]:
    """The source's and sink's ``tc.*`` options for ``config``'s coordinator line.

    A secret that came from a file is passed as that file (``tc.secretFile``, read by
    the driver), so it is in no option; one from ``TXNSTREAM_TC_SECRET`` as ``tc.secret``
    (masked where Spark shows options: ``spark.redaction.regex`` matches ``secret``).
    """
    line = {"tc.principal": config.tc_principal}
    if secret_file:
        line["tc.secretFile"] = secret_file
    elif config.tc_secret:
        line["tc.secret"] = config.tc_secret
    for option, value in (("tc.tls.cafile", config.tc_tls_cafile),
                          ("tc.tls.certfile", config.tc_tls_certfile),
                          ("tc.tls.keyfile", config.tc_tls_keyfile)):
        if value:
            line[option] = value
    return line


def _run_until_idle(query: StreamingQuery, idle_s: float = 6.0) -> None:
    """Let ``query`` run until a batch has run and none came for ``idle_s``, then stop.

    Spark runs a batch only when there is new input or the watermark moved (which closes
    windows), so a quiet spell means everything committed so far has been written.
    """
    import time

    last, since = None, time.monotonic()
    while last is None or time.monotonic() - since < idle_s:
        query.awaitTermination(0.5)  # type: ignore[arg-type]  # typed int; takes seconds
        if (exc := query.exception()) is not None:
            raise exc
        prog = query.lastProgress
        if prog and prog["batchId"] != last:
            last, since = prog["batchId"], time.monotonic()
    query.stop()


def _start_worker(config: Config) -> CoordinatorWorker:
    import time

    from txnstream.coordinator.worker import CoordinatorWorker

    worker = CoordinatorWorker(config).start()
    deadline = time.monotonic() + 60
    while len(worker.serving()) < config.num_coordinators:
        if time.monotonic() > deadline:
            worker.stop()
            raise SystemExit("the coordinator worker did not start serving in 60 s")
        time.sleep(0.1)
    return worker


def _check(config: Config, topic: str, mode: str) -> bool:
    """Read the output committed-only; windowed: no (key, window) written twice."""
    import json
    import uuid

    from rich.console import Console

    from txnstream.cli._common import table
    from txnstream.client import Client

    values: list[bytes] = []
    with Client(config=config) as client:
        c = client.subscribe(topic, subscription=f"example-check-{uuid.uuid4().hex[:6]}")
        while (m := c.receive(timeout_s=5)) is not None:
            values.append(bytes(m.key or b"") + b"|" + (m.value or b""))
            c.acknowledge(m)
        c.close()
    dupes = len(values) - len(set(values))
    rows = [("records in the output (all runs)", str(len(values)), "yes"),
            ("written twice", str(dupes), "yes" if dupes == 0 else "NO")]
    if mode == "windowed":
        counts = [json.loads(v.split(b"|", 1)[1])["count"] for v in values]
        rows.append(("records counted in closed windows", str(sum(counts)), "yes"))
    Console().print(table(f"example pipeline output ({topic}, {mode})",
                          ("check", "result", "ok"), rows))
    return dupes == 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
