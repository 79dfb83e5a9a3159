"""The pipeline on a real Spark standalone cluster, txnstream shipped as a wheel.

A master and a worker run as their own JVMs (the pyspark distribution's ``spark-class``);
executors are JVMs the worker launches. ``spark-submit --py-files <wheel>`` runs the
example pipeline (committed-only txnstream source -> upper-case -> exactly-once txnstream
sink) the way docs/spark.md tells users to. The executors' Python has the dependencies
but not txnstream (checked first): only the shipped wheel gives it to them (the
submitting host has it, as the wheel on its PYTHONPATH). Mid-job an
executor JVM is killed -9; Spark launches a new one and reruns the lost tasks, and the
output holds every committed input row exactly once.
"""

from __future__ import annotations

import os
import shutil
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ProcReaper
from tests.spark.conftest import drain, make_topic
from tests.wheel_build import ROOT, project_wheel

pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.slow]

ROWS = 12_000
PER_TRIGGER = 1_500
PYSPARK_HOME = Path(__import__("pyspark").__file__).parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path) -> dict[str, str]:
    """Spark's environment: loopback only, logs in tmp, no checkout on any path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(tmp / "logs"),
               SPARK_NO_DAEMONIZE="1", SPARK_WORKER_DIR=str(tmp / "work"))
    return env


def _executor_python(tmp: Path) -> Path:
    """A venv whose site-packages reach this venv's packages by a path line in a .pth.

    A path line adds the directory to sys.path, but that directory's own .pth files
    (the editable install's finder among them) are not run: txnstream stays unimportable.
    """
    venv = tmp / "executor-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = next(Path(p) for p in site.getsitepackages() if p.endswith("site-packages"))
    own = next((venv / "lib").glob("python3*/site-packages"))
    (own / "deps.pth").write_text(f"{target}\n")
    return venv / "bin" / "python"


def _spark_class(cls: str, *args: str, tmp: Path, name: str,
                 reaper: ProcReaper) -> subprocess.Popen[bytes]:
    log = (tmp / f"{name}.log").open("wb")
    return reaper.track(subprocess.Popen(
        [str(PYSPARK_HOME / "bin" / "spark-class"), cls, *args], env=_env(tmp), stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True))


def _wait_log(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        assert proc.poll() is None, f"{path.name} exited:\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {path}:\n{path.read_text()[-3000:]}"
        time.sleep(0.3)


def _executors(worker: subprocess.Popen[bytes]) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(worker.pid).children(recursive=True):
        try:
            if any("CoarseGrainedExecutorBackend" in a for a in p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_cluster_pipeline_through_an_executor_kill_writes_every_row_once(
        config, worker, client, tmp_path: Path, proc_reaper: ProcReaper) -> None:
    t0 = time.monotonic()
    wheel = project_wheel()
    exec_py = _executor_python(tmp_path)
    probe = subprocess.run([str(exec_py), "-c", "import txnstream"], cwd=tmp_path,
                           env=_env(tmp_path), capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'txnstream'" in probe.stderr, \
        "the executors' Python already has txnstream: the test would prove nothing"
    deps = subprocess.run([str(exec_py), "-c", "import confluent_kafka, fastavro, pyspark"],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True)
    assert deps.returncode == 0, deps.stderr

    src, dst = make_topic(config, 2, "cl-src"), make_topic(config, 2, "cl-dst")
    producer = client.create_producer(src)
    for start in range(0, ROWS, 1000):
        with client.transaction() as txn:
            for i in range(start, start + 1000):
                producer.send(f"r{i}".encode(), key=str(i).encode(), txn=txn)
    doomed = client.new_transaction()
    for i in range(50):
        producer.send(f"aborted{i}".encode(), txn=doomed)
    doomed.abort()

    port = _free_port()
    master = _spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(port), "--webui-port", str(_free_port()),
                          tmp=tmp_path, name="master", reaper=proc_reaper)
    _wait_log(tmp_path / "master.log", "I have been elected leader", master, 120)
    spark_worker = _spark_class(
        "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
        "--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port",
        str(_free_port()), "--work-dir", str(tmp_path / "work"),
        tmp=tmp_path, name="worker", reaper=proc_reaper)
    _wait_log(tmp_path / "master.log", "Registering worker", master, 120)

    # Spark puts .zip/.egg py-files on the executors' path, not .whl: a pure-Python wheel
    # is a zip archive, shipped under a .zip name (docs/spark.md).
    shipped = tmp_path / "txnstream.zip"
    shutil.copy(wheel, shipped)
    ckpt = tmp_path / "ckpt"
    submit_cmd = [
        str(PYSPARK_HOME / "bin" / "spark-submit"), "--master", f"spark://127.0.0.1:{port}",
        "--py-files", str(shipped),
        "--conf", f"spark.pyspark.python={exec_py}",
        "--conf", f"spark.pyspark.driver.python={exec_py}",
        "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
        "--conf", "spark.executor.memory=768m", "--conf", "spark.task.maxFailures=4",
        "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
        str(ROOT / "spark" / "example_pipeline.py"),
        "--bootstrap", config.bootstrap_servers, "--prefix", config.topics.prefix,
        "--input", src, "--output", dst, "--checkpoint", str(ckpt), "--mode", "transform",
        "--max-records-per-trigger", str(PER_TRIGGER)]
    submit_log = tmp_path / "submit.log"
    # The submitting host has txnstream (here: the wheel on PYTHONPATH, as if pip-installed
    # there); the driver's Python and the Python workers its JVM starts to plan the data
    # source see it. The worker JVM's environment has no PYTHONPATH: executors get the
    # wheel only through --py-files.
    submit_env = dict(_env(tmp_path), PYTHONPATH=str(wheel))
    submit = proc_reaper.track(subprocess.Popen(
        submit_cmd, cwd=tmp_path, env=submit_env, stdout=submit_log.open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True))

    commits = ckpt / "commits"

    def committed() -> int:
        return len([f for f in commits.iterdir() if f.name.isdigit()]) if commits.exists() else 0

    # kill an executor once the job is under way: a batch committed, more to come
    deadline = time.monotonic() + 240
    while committed() < 1 and submit.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    victims = _executors(spark_worker)
    assert submit.poll() is None and victims, (
        f"the job ended (rc {submit.poll()}) or has no executor before the kill:\n"
        f"{submit_log.read_text()[-3000:]}")
    batches_at_kill = committed()
    os.kill(victims[0].pid, signal.SIGKILL)
    rc = submit.wait(420)
    assert rc == 0, submit_log.read_text()[-4000:]
    assert batches_at_kill < ROWS // PER_TRIGGER, \
        f"the kill came after the last batch ({batches_at_kill} committed)"
    launched = [d for d in (tmp_path / "work").glob("app-*/*") if d.name.isdigit()]
    assert len(launched) >= 3, f"no replacement executor was launched: {launched}"

    out = drain(config, dst, expect=ROWS)
    assert len(out) == len(set(out)), f"{len(out) - len(set(out))} rows written twice"
    assert set(out) == {f"R{i}".encode() for i in range(ROWS)}, \
        f"{ROWS - len(set(out))} rows missing or foreign rows written"
    print(f"standalone cluster: {time.monotonic() - t0:.1f}s, executor killed after "
          f"{batches_at_kill} of {ROWS // PER_TRIGGER} batches, {len(launched)} executors")
