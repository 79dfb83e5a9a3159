"""A streaming job for the driver-kill test: txnstream source -> upper -> txnstream sink.

    python tests/spark/upper_job.py BOOTSTRAP PREFIX SRC DST CHECKPOINT [--available-now]
Runs micro-batches of at most 300 records every second; exits once drained (8 s idle).
With --available-now (the run after the kills): replays the batch a kill left planned but
not committed (its range is in the checkpoint), reads the rest in one batch, and exits when
they are written (Trigger.AvailableNow).
"""

import os
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, root)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from txnstream_spark.datasource import TxnStreamDataSource  # noqa: E402

boot, prefix, src, dst, ckpt = sys.argv[1:6]
available_now = "--available-now" in sys.argv[6:]
spark = (SparkSession.builder.master("local[2]").appName("upper-job")
         .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
         .config("spark.executorEnv.PYTHONPATH", root).getOrCreate())
spark.dataSource.register(TxnStreamDataSource)
o = {"kafka.bootstrap.servers": boot, "txnstream.prefix": prefix}
limit = {} if available_now else {"maxRecordsPerTrigger": "300"}
q = (spark.readStream.format("txnstream").options(**o, subscribe=src, **limit,
                                                   startingOffsets="earliest")
     .load().select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))
     .writeStream.format("txnstream")
     .options(**o, topic=dst, **{"txnstream.txnTimeoutSeconds": "600"})
     .option("checkpointLocation", ckpt)
     .trigger(**({"availableNow": True} if available_now else {"processingTime": "1 second"}))
     .start())
if available_now:
    q.awaitTermination()
    if q.exception() is not None:
        raise q.exception()
    print("JOB DONE", flush=True)
    sys.exit(0)
last_batch, last_change = None, time.monotonic()
# drained = a batch has completed, and for 8 s no batch ran and no data was available (a
# batch that runs longer than 8 s under load is not the end: the job used to stop there)
while last_batch is None or time.monotonic() - last_change < 8:
    q.awaitTermination(1)
    if q.exception() is not None:
        raise q.exception()
    prog, status = q.lastProgress, q.status
    if prog and prog["batchId"] != last_batch:
        last_batch, last_change = prog["batchId"], time.monotonic()
    if status["isTriggerActive"] or status["isDataAvailable"]:
        last_change = time.monotonic()
q.stop()
print("JOB DONE", flush=True)
