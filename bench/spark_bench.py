"""Issues 6 and 12 benchmark: the txnstream Spark source and sink against Spark's own Kafka
connector.

One run, one broker, Spark ``local[2]``:

Each measure is the median of three, the two sides taking turns.

* batch source: rows/s of a batch read (``spark.read``) of N committed rows. Anchor:
  spark-sql-kafka with ``kafka.isolation.level=read_committed`` on the same N rows written
  with Kafka's own transactions; txnstream reads the same rows written with txnstream
  transactions. Goal 1.2x (issue 12).
* streaming source: rows/s of a ``spark.readStream`` query with ``Trigger.AvailableNow``
  reading the same N committed rows (same topics, same writing) into the ``noop`` sink,
  timed from building the query to the return of ``awaitTermination``; each query has a
  fresh checkpoint and starts at the earliest offsets. Anchor: spark-sql-kafka streaming
  with ``startingOffsets=earliest`` and ``kafka.isolation.level=read_committed``. The rows
  each query read (the sum of ``numInputRows`` over its progress reports) must be N.
  Neither side gets a per-trigger limit unless ``TXNSTREAM_BENCH_SPARK_TRIGGER_ROWS`` is
  set: then both get it (``maxOffsetsPerTrigger`` / ``maxRecordsPerTrigger``). Goal 1.0x.
* sink: rows/s of ``df.write`` of the same cached N-row DataFrame, each write to a new
  topic and checked. Anchor: Spark's own (at-least-once) Kafka sink;
  txnstream: the exactly-once sink (one group commit). Goal 0.9x (issue 35).
* floors (bench.spark_floor), timed in the same rounds as the sources: a PySpark Python
  data source with the txnstream source's schema and Arrow batches, its rows from memory
  (what PySpark's Python source API costs, whatever the reading), and the same reading
  the topic with plain confluent-kafka and no filter (what reading Kafka in Python
  costs). A source goal the memory floor misses cannot be met by a Python source.
  The sink's floors, timed in the sink's rounds: the same rows through a PySpark Python
  Arrow writer that only turns them into Python lists (what that API costs), and one
  that produces them with plain confluent-kafka, no txn (what writing Kafka from Python
  costs).

spark-sql-kafka comes from Maven Central (``bench/spark_kafka_pom.xml``), at pyspark's
version when Central has it, else the newest release of the same major line (noted in
the results). ``TXNSTREAM_BENCH_SPARK_ROWS`` sets N (default 200,000).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer as KafkaProducer

from bench.common import goal_row, make_topic, ratio, workers
from txnstream import Client, Config

ROOT = Path(__file__).resolve().parent.parent
POM = Path(__file__).with_name("spark_kafka_pom.xml")
CACHE = Path(os.environ.get("TXNSTREAM_CACHE", Path.home() / ".cache" / "txnstream"))
VALUE = 100
PER_TXN = 1000
FALLBACK = ("4.2.0",)
"""spark-sql-kafka releases to try when Central lacks pyspark's own version."""


def _jars() -> tuple[list[str], str]:
    """spark-sql-kafka and what it needs beyond pyspark's own jars; and its version."""
    import pyspark

    have = {_artifact(j) for j in os.listdir(Path(pyspark.__file__).parent / "jars")}
    for version in (pyspark.__version__, *FALLBACK):
        out = CACHE / f"spark-sql-kafka-{version}"
        if not any(out.glob("spark-sql-kafka-*.jar")):
            r = subprocess.run(["mvn", "-B", "-q", "-f", str(POM), f"-Dspark.version={version}",
                                "dependency:copy-dependencies", f"-DoutputDirectory={out}",
                                "-DincludeScope=runtime"], capture_output=True, text=True)
            if r.returncode != 0:
                continue
        return ([str(j) for j in sorted(out.glob("*.jar")) if _artifact(j.name) not in have],
                version)
    raise RuntimeError(f"spark-sql-kafka {pyspark.__version__} (or {FALLBACK}) could not be "
                       "fetched from Maven Central with mvn")


def _artifact(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    name = jar.removesuffix(".jar")
    parts = name.split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def _session(jars: list[str]):
    from pyspark.sql import SparkSession

    from txnstream_spark.datasource import TxnStreamDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    s = (SparkSession.builder.master("local[2]").appName("txnstream-bench")
         .config("spark.jars", ",".join(jars))
         .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.memory", "2g")
         .config("spark.executorEnv.PYTHONPATH", str(ROOT)).getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    s.dataSource.register(TxnStreamDataSource)
    from bench.spark_floor import FloorDataSource

    s.dataSource.register(FloorDataSource)
    return s


def _value(i: int) -> bytes:
    return f"{i:012d}".encode().ljust(VALUE, b"x")


def _fill_kafka_txn(cfg: Config, topic: str, n: int) -> None:
    p = KafkaProducer({**cfg.producer(), "transactional.id": f"bench-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    for start in range(0, n, PER_TXN):
        p.begin_transaction()
        for i in range(start, min(n, start + PER_TXN)):
            while True:
                try:
                    p.produce(topic, _value(i), str(i).encode())
                    break
                except BufferError:
                    p.poll(0.01)
        p.commit_transaction(60)


def _fill_txnstream(cfg: Config, topic: str, n: int) -> None:
    with Client(config=cfg) as client:
        p = client.create_producer(topic)
        for start in range(0, n, PER_TXN):
            with client.transaction() as txn:
                for i in range(start, min(n, start + PER_TXN)):
                    p.send(_value(i), key=str(i).encode(), txn=txn)


def _opts(cfg: Config, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": cfg.bootstrap_servers,
            "txnstream.prefix": cfg.topics.prefix, **extra}


ROUNDS = 3
"""Each side is measured this many times, the two sides taking turns; the median counts."""


def _read(spark, fmt: str, options: dict[str, str]) -> tuple[int, float]:
    """Rows read and seconds of one full read (count + sum of value lengths)."""
    t0 = time.perf_counter()
    r = spark.read.format(fmt).options(**options).load() \
        .selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    return r.n, time.perf_counter() - t0


def stream_progress(spark, fmt: str, options: dict[str, str]) -> tuple[list, float]:
    """One ``Trigger.AvailableNow`` query into the noop sink: its progress reports, and
    seconds from building the query to the return of ``awaitTermination``."""
    with tempfile.TemporaryDirectory(prefix="txnstream-bench-ckpt-") as ckpt:
        t0 = time.perf_counter()
        q = (spark.readStream.format(fmt).options(**options).load()
             .writeStream.format("noop").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        secs = time.perf_counter() - t0
        if q.exception() is not None:
            raise RuntimeError(f"{fmt} streaming query failed: {q.exception()}")
        progress = q.recentProgress
        if len(progress) >= int(spark.conf.get(
                "spark.sql.streaming.numRecentProgressUpdates", "100")):
            raise RuntimeError(f"{fmt} streaming query: too many micro-batches to count its "
                               "rows from its progress reports")
        return progress, secs


def _stream(spark, fmt: str, options: dict[str, str]) -> tuple[int, float]:
    """Rows read and seconds of one :func:`stream_progress` query."""
    progress, secs = stream_progress(spark, fmt, options)
    return sum(p.numInputRows for p in progress), secs


def _write(df, fmt: str, options: dict[str, str], count, n: int) -> float:
    """Seconds of one full write of ``df`` to the topic in ``options``, checked after."""
    t0 = time.perf_counter()
    df.write.format(fmt).options(**options).mode("append").save()
    secs = time.perf_counter() - t0
    if (got := count(options["topic"])) != n:
        raise RuntimeError(f"{fmt} sink wrote {got} of {n} rows to {options['topic']}")
    return secs


FLOOR = "txnstream_floor"
"""bench.spark_floor's data source: a PySpark Python source with the txnstream source's
schema and Arrow batches, rows from memory or read with plain confluent-kafka."""
FLOOR_WHAT = {
    "memory": "a PySpark Python data source, the same rows from memory (no Kafka)",
    "kafka": "a PySpark Python data source reading the same topic with plain confluent-kafka "
             "(read_committed, no filter)",
}


SINK_FLOOR_WHAT = {
    "memory": "a PySpark Python Arrow writer turning the same rows into Python lists, "
              "sending nothing",
    "kafka": "a PySpark Python Arrow writer producing the same rows with plain "
             "confluent-kafka (one produce() per row, no txn)",
}


def _floor_options(cfg: Config, topic: str, n: int) -> dict[str, dict[str, str]]:
    """The floors' options: the same rows (count, partitions, value size), or topic."""
    common = {"rows": str(n), "partitions": "2", "valueBytes": str(VALUE), "topic": topic,
              "bootstrap": cfg.bootstrap_servers}
    return {"memory": {**common, "mode": "memory"}, "kafka": {**common, "mode": "kafka"}}


def _row(measure: str, ours: float, anchor: str, theirs: float, goal: float) -> dict:
    return goal_row(measure, f"{ours:,.0f}", anchor, f"{theirs:,.0f}", ratio(ours, theirs),
                    ">=", goal)


def run(cfg: Config) -> list[dict]:
    """Batch source, streaming source and sink rows/s, side by side with spark-sql-kafka."""
    n = int(os.environ.get("TXNSTREAM_BENCH_SPARK_ROWS", "200000"))
    jars, version = _jars()
    anchor = f"spark-sql-kafka {version}"
    rows: list[dict] = []
    with workers(cfg, 1):
        spark = _session(jars)
        try:
            kafka_src, ours_src = make_topic(cfg, 2), make_topic(cfg, 2)
            _fill_kafka_txn(cfg, kafka_src, n)
            _fill_txnstream(cfg, ours_src, n)
            warm_k, warm_t = make_topic(cfg, 2), make_topic(cfg, 2)
            _fill_kafka_txn(cfg, warm_k, 1000)
            _fill_txnstream(cfg, warm_t, 1000)
            kafka_read = {"kafka.bootstrap.servers": cfg.bootstrap_servers,
                          "kafka.isolation.level": "read_committed"}
            _read(spark, "kafka", {**kafka_read, "subscribe": warm_k})
            _read(spark, "txnstream", _opts(cfg, subscribe=warm_t))
            floors = _floor_options(cfg, kafka_src, n)
            for fo in floors.values():
                _read(spark, FLOOR, {**fo, "rows": "1000"})
            times_k, times_t = [], []
            times_f: dict[str, list[float]] = {name: [] for name in floors}
            for _ in range(ROUNDS):
                got_k, secs = _read(spark, "kafka", {**kafka_read, "subscribe": kafka_src})
                times_k.append(secs)
                got_t, secs = _read(spark, "txnstream", _opts(cfg, subscribe=ours_src))
                times_t.append(secs)
                if got_k != n or got_t != n:
                    raise RuntimeError(f"source read {got_k} (kafka) / {got_t} (txnstream) "
                                       f"of {n}")
                for name, fo in floors.items():
                    got_f, secs = _read(spark, FLOOR, fo)
                    times_f[name].append(secs)
                    if got_f != n:
                        raise RuntimeError(f"floor {name} read {got_f} of {n}")
            secs_k, secs_t = statistics.median(times_k), statistics.median(times_t)
            rows.append(_row(f"batch source rows/s ({n:,} rows, spark.read, median of "
                             f"{ROUNDS})", n / secs_t,
                             f"{anchor} batch source, read_committed", n / secs_k, 1.2))
            rows.extend(_row(f"floor, batch: {FLOOR_WHAT[name]} rows/s", n / statistics.median(
                times_f[name]), f"{anchor} batch source, read_committed", n / secs_k, 1.2)
                for name in floors)

            limit = os.environ.get("TXNSTREAM_BENCH_SPARK_TRIGGER_ROWS")
            kafka_stream = {**kafka_read, "startingOffsets": "earliest",
                            **({"maxOffsetsPerTrigger": limit} if limit else {})}
            ours_stream = {"startingOffsets": "earliest",
                           **({"maxRecordsPerTrigger": limit} if limit else {})}
            _stream(spark, "kafka", {**kafka_stream, "subscribe": warm_k})
            _stream(spark, "txnstream", _opts(cfg, subscribe=warm_t, **ours_stream))
            for fo in floors.values():
                _stream(spark, FLOOR, {**fo, "rows": "1000"})
            times_k, times_t = [], []
            times_f = {name: [] for name in floors}
            for _ in range(ROUNDS):
                got_k, secs = _stream(spark, "kafka", {**kafka_stream, "subscribe": kafka_src})
                times_k.append(secs)
                got_t, secs = _stream(spark, "txnstream",
                                      _opts(cfg, subscribe=ours_src, **ours_stream))
                times_t.append(secs)
                if got_k != n or got_t != n:
                    raise RuntimeError(f"streaming source read {got_k} (kafka) / {got_t} "
                                       f"(txnstream) of {n}")
                for name, fo in floors.items():
                    got_f, secs = _stream(spark, FLOOR, fo)
                    times_f[name].append(secs)
                    if got_f != n:
                        raise RuntimeError(f"streaming floor {name} read {got_f} of {n}")
            secs_k, secs_t = statistics.median(times_k), statistics.median(times_t)
            per = f", {int(limit):,} per trigger" if limit else ""
            rows.append(_row(f"streaming source rows/s ({n:,} rows, readStream AvailableNow "
                             f"to noop{per}, median of {ROUNDS})", n / secs_t,
                             f"{anchor} streaming source, read_committed", n / secs_k, 1.0))
            rows.extend(_row(f"floor, streaming: {FLOOR_WHAT[name]} rows/s",
                             n / statistics.median(times_f[name]),
                             f"{anchor} streaming source, read_committed", n / secs_k, 1.0)
                        for name in floors)

            df = spark.range(0, n, numPartitions=2).selectExpr(
                "cast(id AS string) AS key",
                f"rpad(lpad(cast(id AS string), 12, '0'), {VALUE}, 'x') AS value").cache()
            df.count()
            df.limit(10).write.format("kafka").option(
                "kafka.bootstrap.servers", cfg.bootstrap_servers).option(
                "topic", make_topic(cfg, 2)).save()  # warm-up
            df.limit(10).write.format("txnstream").options(
                **_opts(cfg, topic=make_topic(cfg, 2))).mode("append").save()
            df.limit(10).write.format(FLOOR).option("mode", "memory").mode("append").save()

            def kafka_rows(dst: str) -> int:
                return spark.read.format("kafka").option(
                    "kafka.bootstrap.servers", cfg.bootstrap_servers).option(
                    "subscribe", dst).load().count()

            times_k, times_t = [], []
            sink_floors = {name: {**fo, "topic": ""} for name, fo in
                           _floor_options(cfg, "", n).items()}
            times_sf: dict[str, list[float]] = {name: [] for name in sink_floors}
            for _ in range(ROUNDS):
                for name, fo in sink_floors.items():  # the floors first, in each round
                    fo["topic"] = make_topic(cfg, 2)
                    times_sf[name].append(_write(
                        df, FLOOR, fo, kafka_rows if name == "kafka" else lambda _dst: n, n))
                times_k.append(_write(
                    df, "kafka", {"kafka.bootstrap.servers": cfg.bootstrap_servers,
                                  "topic": make_topic(cfg, 2)},
                    kafka_rows, n))
                times_t.append(_write(
                    df, "txnstream", _opts(cfg, topic=make_topic(cfg, 2)),
                    lambda dst: spark.read.format("txnstream").options(
                        **_opts(cfg, subscribe=dst)).load().count(), n))
            secs_k, secs_t = statistics.median(times_k), statistics.median(times_t)
            rows.append(_row(f"sink rows/s ({n:,} rows, batch write, median of {ROUNDS})",
                             n / secs_t,
                             f"{anchor} sink (at-least-once)", n / secs_k, 0.9))
            rows.extend(_row(f"floor, sink: {SINK_FLOOR_WHAT[name]} rows/s",
                             n / statistics.median(times_sf[name]),
                             f"{anchor} sink (at-least-once)", n / secs_k, 0.9)
                        for name in sink_floors)
        finally:
            spark.stop()
    return rows
