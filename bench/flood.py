"""Another principal's LIST flood against an honest principal's commits (issue 34's rule).

``python -m bench.flood [--quiet 15] [--flood 25] [--txns 1000] [--out FILE]``
(``TXNSTREAM_BOOTSTRAP=host:port`` for an existing broker; else one local broker).

One ``txnstream worker``. Principal ``flooder`` opens ``--txns`` txns on coordinator 0,
so each LIST has pages to show. An honest client commits 1-record txns to coordinator 0,
one every 20 ms: first for ``--quiet`` seconds alone, then for ``--flood`` seconds while
three flooder processes (``tests.integration.coordinator.flooder``, the fairness tests'
own) each keep 16 LISTs unanswered, as fast as the worker answers: the hostile soak's
lister. Reported: the honest commits' p50/p90/p99 in each phase, and the flood's LISTs.
The chaos checker's rule (:mod:`chaos.latency`): flood p99 at most 2x quiet p99.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.__main__ import _md_table, _show
from bench.common import (
    fresh_config,
    machine,
    make_topic,
    pct,
    publish,
    run_broker,
    run_line,
    workers,
)
from txnstream import Client
from txnstream.coordinator.protocol import TcOp

FLOODERS = 3
WINDOW = 16
"""LISTs each flooder keeps unanswered (the hostile soak's ``flood_list_window``)."""
PACE_S = 0.02
MAX_RATIO = 2.0


def _commits(client: Client, topic: str, seconds: float) -> list[float]:
    """Honest 1-record commits to coordinator 0 for ``seconds``: each one's ms."""
    producer = client.create_producer(topic)
    took, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        txn = client.new_transaction(tc_id=0)
        producer.send(b"x" * 100, txn=txn)
        txn.commit()
        took.append((time.perf_counter() - t0) * 1000)
        time.sleep(PACE_S)
    return took


def _open_txns(flooder: Client, count: int) -> None:
    """``count`` activated txns of the flooder on coordinator 0 (a LIST shows no reserved)."""
    seqs: list[int] = []
    while len(seqs) < count:
        seqs += flooder.tc.request(TcOp.RESERVE, 0, count=min(250, count - len(seqs)),
                                   timeout_ms=3_600_000).group_seqs
    now_ms = int(time.time() * 1000)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: flooder.tc.request(
            TcOp.ACTIVATE, 0, txn_seq=s, timeout_ms=3_600_000, open_time_ms=now_ms), seqs))


def run(bootstrap: str, quiet_s: float, flood_s: float, txns: int) -> list[dict]:
    cfg = fresh_config(bootstrap)
    with workers(cfg, 1), Client(config=cfg) as client, \
            Client(config=cfg.with_(tc_principal="flooder")) as flooder:
        topic = make_topic(cfg, 4)
        _commits(client, topic, 2.0)  # warm-up: the producer's ids, the first commits
        _open_txns(flooder, txns)
        ep = flooder.tc.directory.lookup(0, 30)
        if ep is None:
            raise RuntimeError("no owner of coordinator 0 within 30 s")
        quiet = _commits(client, topic, quiet_s)
        procs = [subprocess.Popen(
            [sys.executable, "-m", "tests.integration.coordinator.flooder", ep.endpoint.host,
             str(ep.endpoint.port), "flooder", "-", TcOp.LIST.value, str(flood_s + 1),
             str(WINDOW)], stdout=subprocess.PIPE) for _ in range(FLOODERS)]
        try:
            time.sleep(1.0)  # under way
            flood = _commits(client, topic, flood_s)
            sent = sum(int(p.communicate(timeout=60)[0] or 0) for p in procs)
        finally:
            for p in procs:
                p.kill()
    rows = []
    for phase, xs, lists in (("quiet", quiet, 0), ("LIST flood", flood, sent)):
        rows.append({"phase": phase, "honest commits": len(xs),
                     "p50 ms": round(pct(xs, 50), 1), "p90 ms": round(pct(xs, 90), 1),
                     "p99 ms": round(pct(xs, 99), 1), "max ms": round(max(xs), 1),
                     "flooder LISTs": lists})
    q, f = rows
    rows.append({"phase": "flood / quiet", "p50 ms": f"{f['p50 ms'] / q['p50 ms']:.2f}x",
                 "p99 ms": f"{f['p99 ms'] / q['p99 ms']:.2f}x "
                           f"({'ok' if f['p99 ms'] <= MAX_RATIO * q['p99 ms'] else 'over'}"
                           f" the soak's rule, <= {MAX_RATIO:g}x)"})
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flood")
    ap.add_argument("--quiet", type=float, default=15.0, help="seconds of honest commits alone")
    ap.add_argument("--flood", type=float, default=25.0, help="seconds under the flood")
    ap.add_argument("--txns", type=int, default=1000, help="the flooder's open txns on TC 0")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    with run_broker("txnstream-flood-") as rb:
        rows = run(rb.bootstrap, args.quiet, args.flood, args.txns)
    _show("Honest commits under another principal's LIST flood", rows)
    publish("\n## Honest commits under another principal's LIST flood (issue 34's rule)\n\n"
            + run_line("bench.flood", argv, rb.load)
            + f"Machine: {machine()}; {rb.where()}, one worker; {FLOODERS} flooder processes"
            f" keeping {WINDOW} LISTs each unanswered, {args.txns} txns of theirs to list; "
            f"an honest commit every {PACE_S * 1000:.0f} ms.\n\n{_md_table(rows)}\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
