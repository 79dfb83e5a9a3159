"""One chaos run, phase by phase; whatever happens, every process it started is stopped.

1. **cluster**: a 3-broker LocalCluster on free ports in the run dir; internal and data
   topics at RF 3, min ISR 2.
2. **roles**: coordinator workers (TC + buffer roles) as ``txnstream worker`` processes;
   once every TC is served, committed-only consumers, exactly-once processors,
   producers and two-phase writers (with a PostgreSQL of the run's own,
   :mod:`chaos.twophase`), each a ``python -m chaos.roles`` process in its own session.
3. **workload**: the producers write; the monitor aborts some txns through the admin
   API and watches for stuck txns and worker memory; the nemesis injects faults.
4. **drain**: the nemesis stops and heals, every process runs again, the producers end
   their txns and exit; then the harness waits until no txn is open and the processors
   and consumers have caught up (their groups' lag is 0), up to ``drain_s``.
5. **measure**: internal topics' sizes, the largest snapshot, workers' RSS.
6. **check**: processors and consumers stop; the raw and the committed-only reads; the
   checks of :mod:`chaos.checker`; then the workers stop.
7. **teardown** (always, also on error or Ctrl-C): SIGCONT + SIGKILL to the process
   group of every process started, then the brokers.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from rich.console import Console

from chaos.checker import Anomalies, check, load_truth
from chaos.cluster import ChaosCluster, free_port
from chaos.credentials import FLOODER, HARNESS, TWOPHASE, Credentials
from chaos.hostile import hostile_roles
from chaos.latency import ClockWatch, summarize
from chaos.monitor import Monitor
from chaos.nemesis import Fault, Nemesis
from chaos.probe import PROBE_PARTITIONS, PROBE_TOPIC, KafkaProbe
from chaos.profile import Profile
from chaos.reader import MarkerCheck, max_record_bytes, read_committed, read_raw, record_ages
from chaos.runinfo import (
    code_under_test,
    cursor_tail,
    file_logger,
    last_error,
    log_errors,
    txn_counts,
)
from chaos.supervisor import TXNSTREAM_BIN, Supervisor
from chaos.truth import TruthLog
from chaos.twophase import IN_TOPIC as TWOPHASE_IN
from chaos.twophase import OUT_TOPIC as TWOPHASE_OUT
from chaos.twophase import SUBSCRIPTION as TWOPHASE_SUBSCRIPTION
from chaos.twophase import TwoPhase
from txnstream import Client, Config, TxnStatus

__all__ = ["ChaosRun", "IN_TOPIC", "OUT_TOPIC"]

SLOW_REQUEST_S = 0.25
"""Workers log requests answered this long after they arrived, with their stages: the
commits the latency judge counts as slow are a few hundred ms (chaos.latency)."""
IN_TOPIC = "chaos-in"
OUT_TOPIC = "chaos-out"
DOOMED_TOPIC = "chaos-doomed"
DLQ_TOPIC = "chaos-dlq"
RETRY_TOPIC = "chaos-retry"
"""The processors' retry topic (``reconsume_later``, issue 38)."""
"""The processors' dead-letter topic (issue 38): inputs past their redelivery count."""
"""(hostile) Deleted halfway through the workload while txns that wrote to it commit."""
HOSTILE = ("intruder", "flooder")
"""Roles of the hostile profiles' processes (chaos.hostile)."""
EO_SUBSCRIPTION = "chaos-eo"
READ_SUBSCRIPTION = "chaos-read"
SERVE_TIMEOUT_S = 120.0
"""Workers join, replay and serve every TC: seconds on an idle machine, more on a busy one."""


class ChaosRun:
    """One run of ``profile`` with ``seed`` in ``workdir``."""

    def __init__(self, profile: Profile, seed: int, workdir: Path, console: Console) -> None:
        self.p = profile
        self.seed = seed
        self.workdir = workdir
        self.console = console
        self.truth_dir = workdir / "truth"
        self.sup = Supervisor(workdir / "logs")
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.cluster = ChaosCluster(workdir / "cluster", coordinators=profile.coordinators,
                                    kafka_logger=file_logger(workdir / "logs" / "harness.log"))
        self.creds = Credentials.create(workdir / "secrets")
        self.twophase = TwoPhase(profile, workdir / "logs")
        self.phases: dict[str, float] = {}
        self.nemesis: Nemesis | None = None
        self.monitor: Monitor | None = None
        self.clock = ClockWatch()
        self.probe: KafkaProbe | None = None
        self.client: Client | None = None
        self.summary: dict[str, Any] = {"profile": profile.name, "seed": seed,
                                        "workdir": str(workdir), "error": None,
                                        "code": code_under_test()}

    # ------------------------------------------------------------------ helpers

    def log(self, text: str) -> None:
        """A progress line on the terminal."""
        self.console.log(text, highlight=False, markup=False)

    def _phase(self, name: str, t0: float) -> None:
        self.phases[name] = round(time.monotonic() - t0, 1)

    @property
    def config(self) -> Config:
        """The harness's client settings (an admin principal on the line)."""
        return self.creds.config(self.cluster.config(), HARNESS)

    def _role_argv(self, role: str, name: str, spec: dict[str, Any],
                   truth: Path | None = None) -> Any:
        """``truth``: the folder of its truth files (default the checker's)."""
        boot, prefix = self.cluster.bootstrap, self.cluster.topics.prefix
        truth = truth or self.truth_dir

        def argv(n: int) -> list[str]:
            return [sys.executable, "-m", "chaos.roles", role, "--bootstrap", boot,
                    "--prefix", prefix, "--name", name, "--incarnation", str(n),
                    "--truth", str(truth / f"{name}.{n}.jsonl"),
                    "--seed", str(self.seed), "--spec", json.dumps(spec)]

        return argv

    def _worker_argv(self, name: str) -> Any:
        boot, prefix = self.cluster.bootstrap, self.cluster.topics.prefix

        def argv(n: int) -> list[str]:
            return [TXNSTREAM_BIN, "--bootstrap", boot, "worker", "--prefix", prefix,
                    "--id", f"{name}.{n}", "--session-timeout-ms",
                    str(self.p.session_timeout_ms), "--slow-request-s",
                    str(SLOW_REQUEST_S), "--buffer-topics",
                    ",".join(self._data_topics())]

        return argv

    def _data_topics(self) -> list[str]:
        """The topics the workers serve buffers of from the start."""
        two = [TWOPHASE_IN, TWOPHASE_OUT] if self.twophase.enabled else []
        return [IN_TOPIC, OUT_TOPIC, DLQ_TOPIC, RETRY_TOPIC, *two]

    # ------------------------------------------------------------------ phases

    def start_cluster(self) -> None:
        """Phase 1."""
        t0 = time.monotonic()
        self.log("starting a 3-broker cluster")
        secs = self.cluster.up()
        data = {IN_TOPIC: self.p.in_partitions, OUT_TOPIC: self.p.out_partitions,
                DLQ_TOPIC: 2, RETRY_TOPIC: 2, PROBE_TOPIC: PROBE_PARTITIONS}
        if self.p.hostile:
            data[DOOMED_TOPIC] = 2
        if self.twophase.enabled:
            data |= {TWOPHASE_IN: 2, TWOPHASE_OUT: 2}
        isr = self.cluster.create_topics(data)
        self.summary["min_insync_replicas"] = isr
        self.log(f"cluster {self.cluster.bootstrap} up in {secs:.0f} s; topics RF 3, min ISR "
                 f"{sorted(set(isr.values()))}")
        self._phase("cluster", t0)

    def start_roles(self) -> None:
        """Phase 2."""
        t0 = time.monotonic()
        p = self.p
        for i in range(p.workers):
            self.sup.add(f"worker-{i}", "worker", self._worker_argv(f"worker-{i}"),
                         env=self.creds.worker_env())
            self.sup.start(f"worker-{i}")
        self.client = Client(config=self.config)
        self._wait_served()
        self.log(f"{p.workers} workers serve {p.coordinators} coordinators")
        st = p.session_timeout_ms
        for i in range(p.consumers):
            self.sup.add(f"consumer-{i}", "consumer", self._role_argv("consumer", f"consumer-{i}", {
                "topics": [IN_TOPIC, OUT_TOPIC], "subscription": READ_SUBSCRIPTION,
                "ack_mode": ("individual", "cumulative")[i % 2],
                "session_timeout_ms": st}),
                env=self.creds.env("chaos-consumer"))
        for i in range(p.processors):
            self.sup.add(f"processor-{i}", "processor", self._role_argv(
                "processor", f"processor-{i}", {
                    "input": IN_TOPIC, "output": OUT_TOPIC, "subscription": EO_SUBSCRIPTION,
                    "ack_mode": ("cumulative", "individual")[i % 2],
                    "txn_timeout_s": p.processor_txn_timeout_s, "session_timeout_ms": st,
                    "process_s": list(p.process_s), "dead_letter_topic": DLQ_TOPIC,
                    "max_redeliver_count": p.max_redeliver_count, "retry_topic": RETRY_TOPIC,
                    "retry_ratio": p.retry_ratio, "retry_delay_s": list(p.retry_delay_s)}),
                env=self.creds.env("chaos-processor"))
        ports = [free_port() for _ in range(p.producers)]
        for i in range(p.producers):
            self.sup.add(f"producer-{i}", "producer", self._role_argv("producer", f"producer-{i}", {
                "topic": IN_TOPIC, "listen_port": ports[i],
                "peer_port": ports[(i + 1) % p.producers], "threads": p.producer_threads,
                "txn_timeout_s": p.txn_timeout_s, "abort_ratio": p.abort_ratio,
                "slow_ratio": p.slow_ratio, "slow_timeout_s": p.slow_timeout_s,
                "slow_overrun_s": list(p.slow_overrun_s),
                "abandon_ratio": p.abandon_ratio, "abandon_timeout_s": p.abandon_timeout_s,
                "late_ratio": p.late_ratio, "foreign_ratio": p.foreign_ratio,
                "hold_s": list(p.hold_s),
                "doomed": DOOMED_TOPIC if p.hostile else None, "doomed_ratio": p.doomed_ratio}),
                env=self.creds.env("chaos-producer"))
        for name, role, spec, principal in hostile_roles(p, self.creds, [IN_TOPIC, OUT_TOPIC]):
            self.sup.add(name, role, self._role_argv(role, name, spec),
                         env=self.creds.env(principal))
        if self.twophase.enabled:
            self.twophase.start(self.client)
            self.log(f"PostgreSQL {self.twophase.pg.dsn if self.twophase.pg else '?'} up")
        for i in range(p.twophase_writers):
            name = f"twophase-{i}"
            self.sup.add(name, "twophase", self._role_argv(
                "twophase", name, self.twophase.spec(), self.truth_dir / "twophase"),
                env=self.creds.env(TWOPHASE))
        for role in ("consumer", "processor", "producer", "twophase", *HOSTILE):
            for name in self.sup.names(role):
                self.sup.start(name)
        self._phase("roles", t0)

    def _wait_served(self) -> None:
        assert self.client is not None
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            try:
                stats = self.client.admin.coordinator_stats()
                if len(stats) == self.p.coordinators and all(s.owner_id for s in stats):
                    return
            except Exception:  # noqa: BLE001 - not served yet
                pass
            if time.monotonic() > deadline:
                tails = {n: self.sup.tail(n, 8) for n in self.sup.names("worker")}
                raise RuntimeError(f"coordinators not served within {SERVE_TIMEOUT_S:.0f} s; "
                                   f"worker logs end with: {tails}")
            self.sup.reap_unexpected()
            time.sleep(1.0)

    def workload(self) -> None:
        """Phase 3."""
        t0 = time.monotonic()
        assert self.client is not None
        self.monitor = Monitor(self.sup, self.client, self.p,
                               TruthLog(self.truth_dir / "harness-admin.jsonl"), self.seed)
        self.monitor.start()
        self.nemesis = Nemesis(self.sup, self.cluster, self.p, self.seed, self._on_fault,
                               postgres=self.twophase.pg)
        self.nemesis.start()
        end = t0 + self.p.workload_s
        phases = TruthLog(self.truth_dir / "harness-phases.jsonl")  # chaos.latency
        phases.write({"e": "phase", "phase": "quiet", "t": time.time()})
        self.clock = ClockWatch()  # the wall clock's steps: faults of the machine
        self.probe = KafkaProbe(self.config.common())  # the cluster's own write latency
        self.probe.start()
        next_note = t0 + 30
        doom_at = t0 + self.p.workload_s / 2 if self.p.hostile else None
        fed_at = time.monotonic()
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if self.clock.check():
                self.log(f"the wall clock stepped {self.clock.steps[-1]['step_s']} s against "
                         "the monotonic one (the machine stood still): a fault of its own")
            if self.twophase.enabled:
                self.twophase.feed(self.config, time.monotonic() - fed_at)
                fed_at = time.monotonic()
            if doom_at is not None and time.monotonic() >= doom_at:
                doom_at = None
                self._delete_doomed()
            if time.monotonic() >= next_note:
                next_note += 30
                self.log(f"workload {time.monotonic() - t0:.0f}/{self.p.workload_s:.0f} s: "
                         f"faults {dict(self.nemesis.counts())}, exits nobody caused "
                         f"{len(self.sup.exits)}, admin aborts {self.monitor.admin_aborts}")
        phases.write({"e": "phase", "phase": "end", "t": time.time()})
        phases.close()
        self.probe.halt()
        self.twophase.close_feed()
        self.log("workload over: halting the nemesis")
        self.nemesis.halt()
        self.nemesis.join(180)
        self._phase("workload", t0)

    def _delete_doomed(self) -> None:
        admin = AdminClient(self.config.admin())
        try:
            admin.delete_topics([DOOMED_TOPIC], operation_timeout=30)[DOOMED_TOPIC].result(60)
            self.summary["doomed_deleted_at"] = time.strftime("%H:%M:%S")
            self.log(f"deleted {DOOMED_TOPIC} while txns that wrote to it commit")
        except KafkaException as exc:
            self.summary["doomed_delete_error"] = str(exc)
            self.log(f"could not delete {DOOMED_TOPIC}: {exc}")

    def _doomed_recreated(self) -> bool:
        """Whether the deleted topic exists again (a marker write must never create it)."""
        admin = AdminClient(self.config.admin())
        return DOOMED_TOPIC in admin.list_topics(timeout=15).topics

    def _on_fault(self, f: Fault) -> None:
        self.log(f"fault {f.kind} {f.target} (pid {f.pid}) healed after {f.duration_s:.1f} s"
                 + (f" [error: {f.error}]" if f.error else ""))

    def drain(self) -> None:
        """Phase 4."""
        t0 = time.monotonic()
        assert self.monitor is not None
        for node in self.cluster.node_ids():
            if node not in self.cluster.node_pids():
                self.cluster.start_node(node)
        self.sup.reap_unexpected()  # record (and restart) what died on its own first
        self.sup.ensure_running()
        self.monitor.stop_aborting()
        self.log("stopping the producers (they end their current txns) and intruders")
        self.sup.stop(self.sup.names("producer") + [n for r in HOSTILE
                                                    for n in self.sup.names(r)])
        deadline = time.monotonic() + self.p.drain_s
        state: dict[str, Any] = {}
        stable = 0
        while time.monotonic() < deadline:
            state = self._drain_state()
            aborted = self.monitor.abort_left_by(FLOODER)  # its stop could not end them
            self.summary["flooder_txns_aborted_at_drain"] = \
                self.summary.get("flooder_txns_aborted_at_drain", 0) + aborted
            if state["eo_lag"] == 0 and state["read_lag"] == 0 and state["open_txns"] == 0 \
                    and state["twophase_lag"] == 0:
                stable += 1
                if stable >= 2:
                    break
            else:
                stable = 0
            time.sleep(2.0)
        self.summary["drain"] = state | {"complete": stable >= 2}
        if stable < 2:  # what the readers behind were doing: their stacks, in their logs
            self.sup.dump_stacks([n for r in ("processor", "consumer", "twophase")
                                  for n in self.sup.names(r)])
        self.log(f"drain: lag {state.get('eo_lag')} ({EO_SUBSCRIPTION}), "
                 f"{state.get('read_lag')} ({READ_SUBSCRIPTION}); open txns "
                 f"{state.get('open_txns')}")
        self._phase("drain", t0)

    def _drain_state(self) -> dict[str, Any]:
        assert self.client is not None
        try:
            txns = self.client.admin.list_transactions()
            open_txns = sum(1 for t in txns
                            if t.status not in (TxnStatus.COMMITTED, TxnStatus.ABORTED))
        except Exception:  # noqa: BLE001 - a coordinator failing over: ask again
            open_txns = -1
        eo = self._lags(EO_SUBSCRIPTION, [IN_TOPIC, RETRY_TOPIC])
        read = self._lags(READ_SUBSCRIPTION, [IN_TOPIC, OUT_TOPIC])
        two = self._lags(TWOPHASE_SUBSCRIPTION, [TWOPHASE_IN]) if self.twophase.enabled else {}
        return {"eo_lag": -1 if eo is None else sum(v[1] - v[0] for v in eo.values()),
                "read_lag": -1 if read is None else sum(v[1] - v[0] for v in read.values()),
                "twophase_lag": -1 if two is None else sum(v[1] - v[0] for v in two.values()),
                "open_txns": open_txns, "eo_behind": eo, "read_behind": read}

    def _lags(self, group: str, topics: list[str]) -> dict[str, list[int]] | None:
        """Partitions whose committed cursor is below the end: ``{tp: [cursor, end]}``."""
        c = Consumer(self.config.consumer(group))
        try:
            meta = c.list_topics(timeout=10).topics
            tps = [KafkaTP(t, p) for t in topics for p in meta[t].partitions]
            behind = {}
            for tp in c.committed(tps, timeout=10):
                lo, hi = c.get_watermark_offsets(KafkaTP(tp.topic, tp.partition), timeout=10)
                cursor = max(lo, tp.offset if tp.offset >= 0 else lo)
                if cursor < hi:
                    behind[f"{tp.topic}-{tp.partition}"] = [cursor, hi]
            return behind
        except Exception:  # noqa: BLE001 - unknown now
            return None
        finally:
            c.close()

    def measure(self) -> list[dict[str, Any]]:
        """Sizes and memory against the profile's bounds; the failed ones."""
        t0 = time.monotonic()
        assert self.monitor is not None and self.client is not None
        self.monitor.sample_rss()
        txns = self.monitor.list_txns()
        if txns is not None:
            self.monitor.check_stuck(txns)
        b = self.p.bounds
        t = self.cluster.topics
        sizes = self.cluster.topic_sizes([t.log, t.pending_ack, t.buffer_snapshots])
        snap_max = max_record_bytes(self.config, t.buffer_snapshots)
        self.summary["log_ages"] = ages = record_ages(self.config, t.log)
        held_s = self._held_open_s()
        ages["held_open_s"] = held_s
        rss = max(self.monitor.rss_max_mb.values(), default=0.0)
        mb = 2**20
        rows = {
            "worker RSS MB (max)": (round(rss, 1), b.worker_rss_mb),
            # With txns held open through the run, the count is the traffic since they
            # began (the flood's rate): reported, and the age row judges truncation.
            **({f"{t.log} records": (sizes[t.log].records, b.log_records)}
               if held_s is None else {}),
            f"{t.log} oldest record, s": (ages["oldest_s"], b.log_age_bound(held_s)),
            f"{t.pending_ack} records": (sizes[t.pending_ack].records, b.pending_ack_records),
            f"{t.buffer_snapshots} records": (sizes[t.buffer_snapshots].records,
                                              b.snapshot_records),
            "largest snapshot bytes": (snap_max, b.snapshot_record_bytes),
            **{f"{n} disk MB": (round(sizes[n].disk_bytes / mb, 2), b.topic_disk_mb)
               for n in (t.log, t.pending_ack, t.buffer_snapshots)},
        }
        self.summary["bounds"] = {k: {"value": v, "bound": lim, "ok": v <= lim}
                                  for k, (v, lim) in rows.items()}
        self.summary["worker_rss_mb"] = {k: round(v, 1) for k, v in
                                         self.monitor.rss_max_mb.items()}
        self._phase("measure", t0)
        return [{"what": k, "value": v, "bound": lim} for k, (v, lim) in rows.items() if v > lim]

    def _held_open_s(self) -> float | None:
        """Seconds since the flood's lister began holding its txns open (None: no flood).

        It reserves them when the flood starts (its first ``flood`` phase event) and
        ends them when it stops: the TC log keeps every record since then.
        """
        if not self.p.hostile:
            return None
        floods = [float(ev["t"]) for ev in load_truth(self.truth_dir).phases
                  if ev.get("phase") == "flood" and isinstance(ev.get("t"), (int, float))]
        return round(time.time() - min(floods), 1) if floods else None

    def check(self, over_bounds: list[dict[str, Any]]) -> Anomalies:
        """Phase 6: every check; the anomalies (``over_bounds`` from phase 5 included)."""
        t0 = time.monotonic()
        assert self.monitor is not None and self.nemesis is not None
        self.monitor.halt()
        self.monitor.join(30)
        self.sup.reap_unexpected(restart=False)
        self.log("stopping processors and consumers; reading raw and committed-only")
        self.sup.stop(self.sup.names("processor") + self.sup.names("consumer")
                      + self.sup.names("twophase"))
        topics = [IN_TOPIC, OUT_TOPIC, DLQ_TOPIC, RETRY_TOPIC]
        markers = self._marker_check()
        raw = read_raw(self.config, topics, check=markers)
        targets = {tp: rp.last_expected_visible() for tp, rp in raw.items()}
        delivered = read_committed(self.config, topics, targets)
        truth = load_truth(self.truth_dir)
        drain = self.summary.get("drain", {})
        res = check(truth, raw, delivered, IN_TOPIC, OUT_TOPIC,
                    {"processors": drain.get("eo_behind"), "consumers": drain.get("read_behind")},
                    dlq_topic=DLQ_TOPIC, retry_topic=RETRY_TOPIC)
        an = res.anomalies
        if self.twophase.enabled:
            assert self.client is not None
            found, self.summary["twophase"] = self.twophase.check(
                self.client, markers, self.truth_dir / "twophase",
                bool(drain.get("open_txns") == 0 and drain.get("twophase_lag") == 0))
            for kind, detail, sub in found:
                an.add(kind, detail, sub=sub)
        for s in self.monitor.stuck.values():
            an.add("txn_open_past_timeout", vars(s))
        for ex in self.sup.exits:
            an.add("process_died", {"name": ex.name, "incarnation": ex.incarnation,
                                    "returncode": ex.returncode, "error": last_error(ex.tail),
                                    "log_tail": ex.tail[-1500:]},
                   sub=f"{ex.name.rsplit('-', 1)[0]}: {last_error(ex.tail)[:120]}")
        for o in over_bounds:
            an.add("bound_exceeded", o, sub=o["what"])
        lat = self.summary["commit_latency"] = summarize(
            (e for ends in truth.ends.values() for e in ends), truth.phases,
            [f for f in self.nemesis.as_dicts() if f["role"] in ("worker", "broker")
             and not f["error"]] + self.clock.steps,
            probe=self.probe.samples if self.probe is not None else None,
            cpu=self.probe.cpu if self.probe is not None else ())
        if self.probe is not None:
            lat["kafka_probe"]["errors"] = self.probe.errors
        if lat["verdict"] == "flood_latency":
            an.add("flood_latency", lat)
        if self.p.hostile and "doomed_deleted_at" in self.summary and \
                self._doomed_recreated():
            an.add("deleted_topic_recreated", {"topic": DOOMED_TOPIC})
        if drain.get("open_txns") == 0:
            for sub, key in ((EO_SUBSCRIPTION, "eo_behind"), (READ_SUBSCRIPTION, "read_behind")):
                for tp, (cursor, end) in (drain.get(key) or {}).items():
                    an.add("subscription_cursor_behind", {
                        "subscription": sub, "partition": tp, "cursor": cursor, "end": end,
                        "tail": cursor_tail(raw, tp, cursor)}, sub=sub)
        self.summary["txns"] = txn_counts(truth, res.txns)
        self.summary["records"] = {"checked": res.records_checked,
                                   "visible_in": res.visible.get(IN_TOPIC, 0),
                                   "visible_out": res.visible.get(OUT_TOPIC, 0),
                                   "raw_with_markers": res.raw_records}
        self.summary["notes"] = res.notes | {
            "admin_aborts": self.monitor.admin_aborts,
            "admin_list_errors": self.monitor.admin_errors,
            "committed_read_reached_targets": all(
                any(d.topic == tp[0] and d.partition == tp[1] and d.offset >= off
                    for d in delivered) for tp, off in targets.items() if off >= 0)}
        self.summary["log_errors"] = log_errors(self.sup.procs)
        self.summary["notes"]["ERROR lines in role logs"] = sum(
            e["count"] for e in self.summary["log_errors"])
        self._phase("check", t0)
        return an

    def _marker_check(self) -> MarkerCheck:
        """The workers' marker tag, from their key file and the cluster's id."""
        c = Consumer(self.config.consumer(f"chaos-meta-{self.seed}"))
        try:
            cluster = c.list_topics(timeout=15).cluster_id
        finally:
            c.close()
        return MarkerCheck.from_key_file(self.creds.workers_key_file, cluster)

    # ------------------------------------------------------------------ all of it

    def execute(self) -> int:
        """Run every phase; the summary is in :attr:`summary`; the exit code."""
        t0 = time.monotonic()
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        code = 2
        try:
            self.start_cluster()
            self.start_roles()
            self.workload()
            self.drain()
            over = self.measure()
            an = self.check(over)
            self.sup.stop(self.sup.names("worker"))
            self.summary["anomalies"] = an.as_dict()
            self.summary["anomaly_count"] = an.total()
            code = 1 if an.total() else 0
        except KeyboardInterrupt:
            self.summary["error"] = "interrupted"
            code = 130
        except Exception as exc:  # noqa: BLE001 - reported in the summary, exit code 2
            self.console.print_exception()
            self.summary["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self.teardown()
            signal.signal(signal.SIGTERM, previous)
            self.phases["total"] = round(time.monotonic() - t0, 1)
            self.summary["duration_s"] = self.phases["total"]
            self.summary["phases_s"] = self.phases
            self._fault_summary()
            self.summary["processes"] = {
                "restarts": self.sup.restarts, "unexpected_exits": len(self.sup.exits),
                "pids": {n: p.history for n, p in self.sup.procs.items()}}
        return code

    def _fault_summary(self) -> None:
        faults = self.nemesis.faults if self.nemesis else []
        by_kind: Counter[str] = Counter()
        by_role: dict[str, Counter[str]] = defaultdict(Counter)
        for f in faults:
            if f.error is None:
                by_kind[f.kind] += 1
                by_role[f.kind][f.role] += 1
        self.summary["faults"] = {
            "by_kind": {k: by_kind.get(k, 0) for k in ("kill9", "pause", "broker_kill9",
                                                       "postgres_kill9")},
            "by_role": {k: dict(v) for k, v in by_role.items()},
            "failed": sum(1 for f in faults if f.error),
            "log": self.nemesis.as_dicts() if self.nemesis else [],
            "clock_steps": self.clock.steps}

    def teardown(self) -> None:
        """Stop the nemesis and monitor, every role process, then the brokers."""
        for th in (self.nemesis, self.monitor, self.probe):
            if th is not None:
                th.halt()
        # Let the nemesis heal its current fault (SIGCONT, restarts) before the kill.
        if self.nemesis is not None and self.nemesis.is_alive():
            self.nemesis.join(30)
        self.sup.cleanup()
        try:
            self.twophase.close()
        except Exception:  # noqa: BLE001 - teardown goes on
            pass
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        self.cluster.down()

    def remove_broker_data(self) -> None:
        """Delete the brokers' data (logs and truth files stay)."""
        for i in self.cluster.node_ids():
            shutil.rmtree(self.cluster.cluster.layout.data_dir(i), ignore_errors=True)


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
