"""The cluster's own write latency through the run: Kafka's anchor for the latency judge.

The honest commits' flood/quiet p99 (:mod:`chaos.latency`) has been over its 2x in every
hostile soak since seed 72, with commits clear of faults taking 0.2-0.4 s, many of them
10-25 s after a broker came back. Whether the cluster itself was slow then (a broker
catching up, leaderships moving, the cores busy) or txnstream was, a plain Kafka write
measured at the same moments says. :class:`KafkaProbe` writes one small record with
``acks=all`` every :data:`PROBE_EVERY_S` to :data:`PROBE_TOPIC` (RF 3, min ISR 2, a
partition per broker, taken in turn) from a thread of the harness, which the nemesis
never kills or pauses, and times each write on the monotonic clock.

:func:`chaos.latency.summarize` judges these writes by the commits' rule, clear of the
same faults, and reports them beside the verdict (``kafka_probe``); the verdict is the
commits' alone. Each of the slowest judged commits also gets the slowest probe write that
overlapped it (``probe_max_ms``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil
from confluent_kafka import KafkaException, Producer

__all__ = ["PROBE_TOPIC", "PROBE_PARTITIONS", "PROBE_EVERY_S", "KafkaProbe"]

PROBE_TOPIC = "chaos-probe"
PROBE_PARTITIONS = 3
"""One per broker: the leaders spread over the cluster, and every write lands on another."""
PROBE_EVERY_S = 0.1
CPU_EVERY_S = 1.0
"""How often the machine's cores are sampled (``psutil.cpu_times``)."""
PROBE_TIMEOUT_S = 30.0
"""A write not delivered by then counts as taking this long (the broker is down)."""


class KafkaProbe(threading.Thread):
    """Write a record every :data:`PROBE_EVERY_S` and time it, until :meth:`halt`.

    ``samples``: ``(start on the wall clock, seconds on the monotonic one)`` of every
    write, delivered or not (an undelivered one counts its wait).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(name="kafka-probe", daemon=True)
        self._producer = Producer(settings | {
            "acks": "all", "linger.ms": 0, "enable.idempotence": True,
            "message.timeout.ms": int(PROBE_TIMEOUT_S * 1000)})
        self._halt = threading.Event()
        self.samples: list[tuple[float, float]] = []
        self.errors = 0
        """Writes refused or not delivered (a halt cuts the last one short)."""
        self._done: bool | None = None
        self.cpu: list[tuple[float, float, float, float]] = []
        """``(start, seconds, busy, steal)``: the share of every core busy, and stolen by
        the machine's host, over each :data:`CPU_EVERY_S` from ``start`` (wall clock)."""
        self._last_cpu = _cpu_times()

    def run(self) -> None:
        """The write loop: one write at a time, each awaited."""
        n = 0
        while not self._halt.wait(PROBE_EVERY_S):
            self._sample_cpu()
            wall, t0 = time.time(), time.monotonic()
            try:
                self._producer.produce(PROBE_TOPIC, b"probe", partition=n % PROBE_PARTITIONS,
                                       on_delivery=self._delivered)
            except (KafkaException, BufferError):
                self.errors += 1
                continue
            n += 1
            self._done = None
            while self._done is None and not self._halt.is_set() and \
                    time.monotonic() - t0 < PROBE_TIMEOUT_S:
                self._producer.poll(0.05)
            if self._done is not None or time.monotonic() - t0 >= PROBE_TIMEOUT_S:
                self.samples.append((wall, time.monotonic() - t0))
            if self._done is not True:
                self.errors += 1

    def _sample_cpu(self) -> None:
        now = _cpu_times()
        if now is None or self._last_cpu is None:
            return
        (w0, m0, total0, idle0, steal0), (_, m1, total1, idle1, steal1) = self._last_cpu, now
        if m1 - m0 < CPU_EVERY_S:
            return
        self._last_cpu = now
        ticks = total1 - total0
        if ticks > 0:
            self.cpu.append((w0, m1 - m0, round(1 - (idle1 - idle0) / ticks, 3),
                             round((steal1 - steal0) / ticks, 3)))

    def _delivered(self, err: Any, _msg: Any) -> None:
        self._done = err is None

    def halt(self) -> None:
        """Stop writing; the thread ends within one poll."""
        self._halt.set()
        self.join(5.0)
        self._producer.flush(1.0)


def _cpu_times() -> tuple[float, float, float, float, float] | None:
    """Every core's times so far (psutil), None where psutil cannot say.

    ``(wall, monotonic, all seconds, idle + iowait seconds, steal seconds)``.
    """
    try:
        t = psutil.cpu_times()
    except (OSError, psutil.Error):
        return None
    steal = getattr(t, "steal", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = t.user + t.nice + t.system + idle + getattr(t, "irq", 0.0) + \
        getattr(t, "softirq", 0.0) + steal  # guests are counted in user already
    return time.time(), time.monotonic(), total, idle, steal
