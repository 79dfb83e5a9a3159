"""One principal's flood of LIST or STATS cannot stall another's commits (issue 34 item 2).

Old (520e46f): with 10,000 txns of her own on a coordinator, a stranger pipelined LIST
(or STATS) requests faster than the worker's one loop thread could sort (or count) the
table for each; they queued without bound, and an honest client's commits waited behind
the whole backlog ("outcome unknown" after 40 s), for ~30 s after the flood stopped.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txnstream import Client
from txnstream.config import Config
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker

from .conftest import FAST_FAILOVER_MS, wait_until

pytestmark = pytest.mark.integration

SECRETS = {"alice": "alice-secret-77e1", "bob": "bob-secret-1c0d"}
BOB_TXNS = 10_240
FLOOD_S = 12.0
COMMIT_P99_BOUND_S = 2.0
"""An honest commit during the flood, at worst (a quiet one takes ~10-50 ms here)."""


@pytest.fixture
def worker(own_config: Config, tmp_path: Path) -> Iterator[tuple[Config, CoordinatorWorker]]:
    users = tmp_path / "tc-users"
    users.write_text("".join(f"{who}={secret}\n" for who, secret in SECRETS.items()))
    users.chmod(0o600)
    cfg = own_config.with_(tc_secret="admin-secret-5d2a", tc_users_file=str(users))
    w = CoordinatorWorker(cfg, settings=WorkerSettings(
        session_timeout_ms=FAST_FAILOVER_MS, max_open_txns_per_principal=20_000,
        buffer_role=False))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == cfg.num_coordinators, 60, "worker serving")
        yield cfg, w
    finally:
        w.stop()


@pytest.mark.alone  # its bound is a latency: beside the parallel run's load it measured
# that (p99 2.29 and 3.83 s of 14-26 commits in two full runs of stop 43), not the worker
@pytest.mark.parametrize("op", [TcOp.LIST, TcOp.STATS])
def test_another_principals_flood_of_list_or_stats_does_not_stall_commits(worker, op, proc_reaper):
    cfg, w = worker
    bob = Client(config=cfg.with_(tc_principal="bob", tc_secret=SECRETS["bob"]))
    alice = Client(config=cfg.with_(tc_principal="alice", tc_secret=SECRETS["alice"]))
    try:
        for _ in range(BOB_TXNS // 256):  # bob's own txns: what each LIST sorts and STATS counts
            bob.tc.request(TcOp.RESERVE, 0, count=256, timeout_ms=600_000)
        quiet = []
        for _ in range(20):
            t0 = time.monotonic()
            alice.new_transaction(timeout_s=120, tc_id=0).commit()
            quiet.append(time.monotonic() - t0)
        flooders = [proc_reaper.track(subprocess.Popen(
            [sys.executable, "-m", "tests.integration.coordinator.flooder", w.address.host,
             str(w.address.port), bob.tc.cluster.decode(), "bob", SECRETS["bob"], op.value,
             str(FLOOD_S)],
            stdout=subprocess.PIPE, start_new_session=True)) for _ in range(3)]
        time.sleep(1.0)  # the flood under way
        took: list[float] = []
        t_end = time.monotonic() + FLOOD_S - 2
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            txn = alice.new_transaction(timeout_s=120, tc_id=0)
            txn.commit()
            took.append(time.monotonic() - t0)
        sent = [int(p.communicate(timeout=60)[0]) for p in flooders]
        assert sum(sent) > 1_000, f"the flood sent only {sum(sent)} requests"
        took.sort()
        p99 = took[int(len(took) * 0.99)] if len(took) > 1 else took[0]
        print(f"{op.value} flood of {sum(sent)} requests: {len(took)} honest commits, median "
              f"{statistics.median(took) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (quiet: "
              f"median {statistics.median(quiet) * 1000:.0f} ms, max {max(quiet) * 1000:.0f})")
        assert p99 <= COMMIT_P99_BOUND_S, (
            f"honest commits during a {op.value} flood: {len(took)} in {FLOOD_S:.0f} s, "
            f"median {statistics.median(took):.2f} s, p99 {p99:.2f} s")
        # and the backlog is gone with the flood, not 30 s after it
        t0 = time.monotonic()
        alice.new_transaction(timeout_s=60, tc_id=0).commit()
        after = time.monotonic() - t0
        assert after < COMMIT_P99_BOUND_S, f"a commit right after the flood took {after:.2f} s"
    finally:
        alice.close()
        bob.close()


LISTED_TXNS = 1_000
"""Bob's open txns on the flooded coordinator: every LIST has pages to show (as the
hostile soak's lister's: 1,000 a coordinator)."""
LIST_FLOOD_S = 10.0
SLOWDOWN_BOUND = 6.0
SLOWDOWN_SLACK_S = 0.04
"""An honest commit's median during a LIST flood, at worst: 6x its quiet median + 40 ms
(in-process worker here, ~26 ms against ~3 quiet; 247 ms on the old code)."""


def _open_listed(bob: Client) -> None:
    """:data:`LISTED_TXNS` open txns of bob's on coordinator 0: every LIST has pages."""
    seqs = [s for _ in range(LISTED_TXNS // 250) for s in bob.tc.request(
        TcOp.RESERVE, 0, count=250, timeout_ms=600_000).group_seqs]
    now_ms = int(time.time() * 1000)
    for s in seqs:  # activated: a LIST shows no reserved txn
        bob.tc.request(TcOp.ACTIVATE, 0, txn_seq=s, timeout_ms=600_000,
                       open_time_ms=now_ms)


@pytest.mark.alone  # a latency, as above
def test_a_list_flood_with_pages_to_show_keeps_commits_near_their_quiet_latency(
        worker, proc_reaper):
    """Old (3790e3a): a LIST page was 1,000 txns (~200 KB), encoded after the turn's
    handling; three connections keeping 16 LISTs each unanswered took honest commits
    from 3 ms to a median of 130-150 ms (the soak's ``flood_latency``)."""
    cfg, w = worker
    bob = Client(config=cfg.with_(tc_principal="bob", tc_secret=SECRETS["bob"]))
    alice = Client(config=cfg.with_(tc_principal="alice", tc_secret=SECRETS["alice"]))
    try:
        _open_listed(bob)
        listed = bob.tc.request(TcOp.LIST, 0, after_seq=-1)
        assert listed.txns, "bob's LIST has nothing to show"

        def commits(seconds: float) -> list[float]:
            took, end = [], time.monotonic() + seconds
            while time.monotonic() < end:
                t0 = time.monotonic()
                alice.new_transaction(timeout_s=120, tc_id=0).commit()
                took.append(time.monotonic() - t0)
                time.sleep(0.02)
            return took

        quiet = commits(4.0)
        flooders = [proc_reaper.track(subprocess.Popen(
            [sys.executable, "-m", "tests.integration.coordinator.flooder", w.address.host,
             str(w.address.port), bob.tc.cluster.decode(), "bob", SECRETS["bob"], TcOp.LIST.value,
             str(LIST_FLOOD_S), "16"],
            stdout=subprocess.PIPE, start_new_session=True)) for _ in range(3)]
        time.sleep(1.0)  # the flood under way
        flood = commits(LIST_FLOOD_S - 3)
        sent = [int(p.communicate(timeout=60)[0]) for p in flooders]
        assert sum(sent) > 300, f"the flood sent only {sum(sent)} LISTs"
        q50, f50 = statistics.median(quiet), statistics.median(flood)
        f99 = sorted(flood)[int(len(flood) * 0.99)]
        print(f"LIST flood of {sum(sent)}: {len(flood)} honest commits, median {f50 * 1000:.1f}"
              f" ms, p99 {f99 * 1000:.1f} ms (quiet: {len(quiet)}, median {q50 * 1000:.1f} ms)")
        assert f50 <= SLOWDOWN_BOUND * q50 + SLOWDOWN_SLACK_S, (
            f"honest commits during a LIST flood: median {f50 * 1000:.1f} ms against "
            f"{q50 * 1000:.1f} ms quiet ({len(flood)} commits, p99 {f99 * 1000:.1f} ms)")
    finally:
        alice.close()
        bob.close()


READ_FLOOD_S = 8.0
THROTTLED_AT_MOST = 0.3
"""Bob's LISTs a second under his read quota, against the same flood by an admin (exempt):
5% of the worker's time and a 0.25 s burst come to ~8% of it over 8 s."""


@pytest.mark.alone  # a rate, as above
def test_a_principals_list_flood_is_held_to_its_read_share_of_the_worker(worker, proc_reaper):
    """Old (950340a): fairness only; bob's LISTs, sent as fast as they were answered, had
    every idle moment of the worker, as the admin's do (a quarter of a core per worker in
    the hostile flood of seed 54, and honest commits waited for that CPU)."""
    cfg, w = worker
    bob = Client(config=cfg.with_(tc_principal="bob", tc_secret=SECRETS["bob"]))
    try:
        _open_listed(bob)
        cluster = bob.tc.cluster.decode()
    finally:
        bob.close()

    def flood(principal: str, secret: str, seconds: float) -> float:
        p = proc_reaper.track(subprocess.Popen(
            [sys.executable, "-m", "tests.integration.coordinator.flooder", w.address.host,
             str(w.address.port), cluster, principal, secret, TcOp.LIST.value, str(seconds),
             "16"], stdout=subprocess.PIPE, start_new_session=True))
        return int(p.communicate(timeout=60)[0]) / seconds

    assert cfg.tc_secret is not None
    admin = flood(cfg.tc_principal, cfg.tc_secret, 3.0)
    bobs = flood("bob", SECRETS["bob"], READ_FLOOD_S)
    print(f"LISTs a second: the admin's {admin:.0f}, bob's {bobs:.0f}")
    assert admin > 100, f"the admin's flood got only {admin:.0f} LISTs a second"
    assert bobs <= THROTTLED_AT_MOST * admin, (
        f"bob's LISTs were answered at {bobs:.0f}/s against the admin's {admin:.0f}/s: "
        f"his read quota (5% of the worker) did not hold him")
