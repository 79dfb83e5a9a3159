"""The checker: what the processes believe (truth files) against what Kafka holds.

Each check counts its anomalies by kind and keeps a few examples; :data:`MAPS_TO` says
which defect of issue 11 a kind most likely points at. The checks:

1. every record of a committed txn visible to a committed-only reader, exactly once
   (``committed_record_missing``, ``duplicate_record``, and per missing record what the
   raw partition shows: not there, after its txn's marker, under an ABORT marker, ...),
   except those its writer was told are out (``RecordsExcludedError``, issue 33: the
   ``excluded`` events, matched by their raw offsets): those must not be delivered, to
   the committed-only read or to a consumer (``excluded_record_visible``), and each
   offset a writer was told is out must hold a record logged as sent in that txn
   (``excluded_offset_unmatched``). So every writer's in/out answer equals what readers
   deliver, record by record; a record whose writer was told neither (``unsure``: its
   commit or flush raised another error) is neither demanded nor forbidden;
2. nothing of an aborted txn visible (``aborted_record_visible``); a txn whose outcome is
   unknown is all or nothing (``unknown_txn_partial``), and if it committed while the
   client said ABORTED, ``reported_aborted_but_committed``;
3. per partition, delivery in offset order and, per writer, in sequence order
   (``order_violation``);
4. each processor input visible yields exactly one visible output, or, past the
   processors' redelivery count, exactly one dead letter, never both (issue 38:
   ``input_not_processed``, ``input_processed_twice``, ``output_without_input``,
   ``input_dead_lettered_twice``, ``input_processed_and_dead_lettered``,
   ``dead_letter_without_input``); the dead-letter topic's records are checked here
   alone (a dead letter is a copy of its input: it names the input's id). A processor
   also retries some inputs later (``reconsume_later``): a retry letter, a copy of its
   input in the retry topic, is taken out of checks 3 and 5 like a dead letter, and its
   output (or dead letter) counts for the input it names, so a retry whose letter and
   ack were not atomic shows as ``input_not_processed`` or ``input_processed_twice``;
   a retry letter of no input seen is ``retry_letter_without_input``;
5. the committed-only consumers got every visible record (``consumer_missed_record``)
   and nothing aborted (``consumer_saw_aborted``);
6. no TxnID issued twice (``txn_id_issued_twice``); the raw partitions agree on each
   txn's outcome (``split_outcome``) and no txn record is left without a marker
   (``txn_without_marker``); the client and the admin never both got a success for
   opposite outcomes (``contradictory_outcomes``).
7. (hostile profile) nothing the forger wrote is delivered, to the committed-only read
   or to a consumer (``forged_record_visible``); no line request about a txn its sender
   did not open was accepted, no LIST showed another principal's txns, no worker kept a
   raw connection that never handshook, nothing the flood tried (:mod:`chaos.roles.flooder`)
   was let through (``line_intrusion``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.reader import Delivered, RawPartition
from chaos.truth import read_events

__all__ = ["Anomalies", "Truth", "load_truth", "check", "MAPS_TO"]

EXAMPLES = 3

MAPS_TO = {
    "committed_record_missing": "items 1/4/5/7 (see the diagnosis counts: after-marker "
                                "straggler = 7, ABORT marker = 4/5, raw-visible but not "
                                "delivered = 1)",
    "duplicate_record": "item 1/2 (a record delivered twice by the committed-only read)",
    "excluded_record_visible": "issue 33 (a writer told its record is out of the txn, "
                               "readers deliver it: the fate check and the fold disagree)",
    "excluded_offset_unmatched": "issue 33 (a writer told an offset is out that holds no "
                                 "record logged in the txn: wrong delivered offsets)",
    "aborted_record_visible": "items 4/5 (markers that disagree with the outcome)",
    "unknown_txn_partial": "items 4/5 (a txn ended differently on its partitions)",
    "reported_aborted_but_committed": "item 8 (commit() reports ABORTED when unknown)",
    "order_violation": "item 1/10 (offset or sequence order broken)",
    "input_not_processed": "item 3 (exactly-once processing stalls) or 10 (redelivery "
                           "behind newer messages lets a cumulative ack skip inputs)",
    "input_processed_twice": "item 2 (pending-ack fencing holes: a zombie commits)",
    "output_without_input": "item 2/4 (an output for an input no reader sees)",
    "input_dead_lettered_twice": "issue 38 (a dead letter's txn and its ack not atomic, "
                                 "or a redelivery after the ack)",
    "input_processed_and_dead_lettered": "issue 38 (a record past the count handed out, or "
                                         "its ack lost after the dead letter)",
    "dead_letter_without_input": "issue 38 (a dead letter of a record no reader sees)",
    "retry_letter_without_input": "issue 38 (a retry letter of a record no reader sees)",
    "consumer_missed_record": "item 1 (committed records dropped by the bounded hold)",
    "consumer_saw_aborted": "items 4/5",
    "txn_id_issued_twice": "item 4 (replies sent for entries not in the log)",
    "split_outcome": "item 5 (timeout abort not logged; a new owner commits)",
    "txn_without_marker": "item 4 (a registered partition gets no marker)",
    "contradictory_outcomes": "items 4/5",
    "record_of_unlogged_txn": "item 4 (a TxnID no client was given)",
    "txn_open_past_timeout": "items 5/6 (timeouts not enforced, finalization stuck)",
    "process_died": "item 3 (a paused consumer dies on resume: UNKNOWN_MEMBER_ID) or 11",
    "bound_exceeded": "item 6 (unbounded state)",
    "forged_record_visible": "issue 20 item 1 (a forged marker counted, or a forged or "
                             "copied txn.id record was released)",
    "deleted_topic_recreated": "issue 20 item 3 (a marker write recreated a deleted topic)",
    "line_intrusion": "issue 19 / 34 (the line: a stranger's or an unauthenticated request "
                      "was accepted, a worker kept a connection that never handshook or "
                      "sent garbage, a client talked to an impostor, a group replay "
                      "committed twice)",
    "twophase_not_atomic": "issue 39 (a prepared txn completed against the database's "
                           "decision: recovery, the age abort or a lost connection)",
    "twophase_duplicate": "issue 39 (an input processed twice: its ack held by a prepared "
                          "txn was released, or a row written twice)",
    "twophase_lost": "issue 39 (an input acked with nothing written for it)",
    "twophase_told_committed": "issue 39 (complete() said COMMITTED, the rows or records "
                               "are not there)",
    "flood_latency": "issue 34 item 2/3/7 (honest commit p99 in the flood phase over 2x "
                     "the quiet phase's, commits clear of faults: a principal or a socket "
                     "holder slows others)",
    "subscription_cursor_behind": "item 10 (acks not kept: a restart redelivers what was "
                                  "acked) or a liveness hole in the cursor commit",
}


@dataclass
class Anomalies:
    """Anomaly counts by kind, with a few examples each."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    detail: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, kind: str, example: dict[str, Any], sub: str | None = None) -> None:
        """Count one anomaly of ``kind`` (``sub``: its diagnosis); keep a few examples."""
        self.counts[kind] += 1
        if sub is not None:
            self.detail[kind][sub] += 1
        ex = self.examples[kind]
        if len(ex) < EXAMPLES and (sub is None or all(e.get("why") != sub for e in ex)
                                   or len(ex) < 1):
            ex.append(example)

    def total(self) -> int:
        """All anomalies."""
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        """For the JSON summary."""
        return {k: {"count": n, "maps_to": MAPS_TO.get(k, ""),
                    "detail": dict(self.detail.get(k, {})), "examples": self.examples[k]}
                for k, n in sorted(self.counts.items())}


@dataclass
class Truth:
    """Every truth file, joined by TxnID."""

    opens: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    sent: dict[str, list[tuple[list[Any], str]]] = field(
        default_factory=lambda: defaultdict(list))
    """TxnID -> ``(rec, how)``: ``how`` is ``late``, ``foreign`` or empty."""
    unsure: set[str] = field(default_factory=set)
    """Ids of records whose writer does not know whether they are in their txn."""
    excluded: dict[str, set[tuple[str, int, int]]] = field(
        default_factory=lambda: defaultdict(set))
    """TxnID -> the raw places (topic, partition, offset) its writers were told are out."""
    excluded_how: Counter[str] = field(default_factory=Counter)
    """Excluded places by how the writer learnt it (``foreign`` / ``late``)."""
    ends: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    admin: dict[str, dict[str, Any]] = field(default_factory=dict)
    pairs: dict[str, str] = field(default_factory=dict)
    """Processor output id -> input id."""
    received: Counter[str] = field(default_factory=Counter)
    received_txn: dict[str, str | None] = field(default_factory=dict)
    late_rejected: int = 0
    intrusions: list[dict[str, Any]] = field(default_factory=list)
    intruder_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """The last ``intruder_stats`` of each intruder incarnation: ``who op outcome`` -> n."""
    flood_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """The last ``flood_stats`` of each flooder incarnation: ``who op outcome`` -> n."""
    phases: list[dict[str, Any]] = field(default_factory=list)
    """``phase`` events: the workload's quiet start, the flood's start, the end."""
    regressions: int = 0
    dup_in_batch: int = 0

    def expected(self, txn: str) -> str:
        """The expected outcome (committed/aborted/unknown/contradictory) from every belief."""
        beliefs = {e["outcome"] for e in self.ends.get(txn, ())}
        admin_aborted = self.admin.get(txn, {}).get("status") == "ABORTED"
        if "committed" in beliefs and admin_aborted:
            return "contradictory"
        if "committed" in beliefs:
            return "committed"
        if beliefs & {"aborted", "abandoned"} or admin_aborted:
            return "aborted"
        return "unknown"

    def client_status(self, txn: str) -> str | None:
        """The status the opener's client reported last for ``txn``."""
        ends = self.ends.get(txn)
        return ends[-1].get("status") if ends else None


def load_truth(truth_dir: Path) -> Truth:
    """Read and join every truth file."""
    t = Truth()
    for stem, ev in read_events(truth_dir):
        e = ev.get("e")
        txn = ev.get("txn")
        if e == "open":
            t.opens[txn].append(ev | {"file": stem})
        elif e == "sent":
            how = "late" if ev.get("late") else "foreign" if ev.get("foreign") else ""
            t.sent[txn].extend((r, how) for r in ev["recs"])
            if ev.get("unsure"):
                t.unsure.update(r[0] for r in ev["recs"])
            for oid, iid in ev.get("pairs", ()):
                t.pairs[oid] = iid
        elif e == "end":
            t.ends[txn].append(ev)
        elif e == "admin_abort":
            t.admin[txn] = ev
        elif e == "late_rejected":
            t.late_rejected += 1
            if ev.get("rec"):  # handed over, then the flush failed: fate unknown
                t.sent[txn].append((ev["rec"], "late"))
                t.unsure.add(ev["rec"][0])
        elif e == "excluded":
            for topic, partition, offset in ev["at"]:
                t.excluded[txn].add((topic, int(partition), int(offset)))
                t.excluded_how[ev.get("how", "")] += 1
        elif e == "intrusion":
            t.intrusions.append(ev)
        elif e == "intruder_stats":
            t.intruder_counts[stem] = ev.get("counts", {})
        elif e == "flood_stats":
            t.flood_counts[stem] = ev.get("counts", {})
        elif e == "phase":
            t.phases.append(ev)
        elif e == "regress":
            t.regressions += 1
        elif e == "dup_in_batch":
            t.dup_in_batch += 1
        elif e == "recv":
            for rid, _topic, _p, _off, rtxn in ev["recs"]:
                if rid is not None:
                    t.received[rid] += 1
                    t.received_txn[rid] = rtxn
    return t


@dataclass
class CheckResult:
    """What the checks found and how much they looked at."""

    anomalies: Anomalies
    txns: Counter[str]
    records_checked: int
    visible: Counter[str]
    raw_records: int
    notes: dict[str, Any]


_PREFIX = {"late": "late send: ", "foreign": "sent after a foreign commit, told in: "}


def _diagnose(rid: str, txn: str, where: dict[str, tuple[tuple[str, int], int]],
              raw: dict[tuple[str, int], RawPartition], how: str) -> str:
    loc = where.get(rid)
    if loc is None:
        return "not in the partition"
    tp, off = loc
    m = raw[tp].first_marker.get(txn)
    prefix = _PREFIX.get(how, "")
    if m is None:
        return prefix + "no marker for its txn on that partition"
    kind, moff = m
    if moff < off:
        return prefix + f"after its txn's first marker ({kind})"
    if kind == "ABORT":
        return prefix + "under an ABORT marker"
    return prefix + "raw says visible, not delivered"


def _place(loc: tuple[tuple[str, int], int] | None) -> tuple[str, int, int] | None:
    """A record's raw place (topic, partition, offset), from ``where``."""
    return None if loc is None else (loc[0][0], loc[0][1], loc[1])


def _holds(raw: dict[tuple[str, int], RawPartition], place: tuple[str, int, int]) -> str:
    """What the raw partition holds at ``place`` (for an unmatched excluded offset)."""
    for rec in raw[(place[0], place[1])].records:
        if rec.offset == place[2]:
            if rec.marker is not None:
                return f"a {rec.marker} marker of {rec.txn}"
            return f"record {rec.value and rec.value.get('id')} of {rec.txn}"
    return "nothing (not in the raw read)"


def _reach(behind: dict[str, list[int]] | None, topic: str, partition: int, offset: int) -> str:
    """Why a subscription never logged a record: its cursor stopped below it, or passed it."""
    if behind is None:
        return "cursor unknown"
    got = behind.get(f"{topic}-{partition}")
    if got is not None and offset >= got[0]:
        return "not reached: the group's cursor is stuck below it"
    return "skipped: the group's cursor passed it"


def check(truth: Truth, raw: dict[tuple[str, int], RawPartition], delivered: list[Delivered],
          in_topic: str, out_topic: str,
          behind: dict[str, dict[str, list[int]] | None] | None = None,
          dlq_topic: str | None = None, retry_topic: str | None = None) -> CheckResult:
    """Run every data check.

    ``behind``: per subscription (``processors``, ``consumers``), the partitions whose
    committed cursor was below the end after the drain, ``{tp: [cursor, end]}``.
    ``dlq_topic``, ``retry_topic``: the processors' dead-letter and retry topics (check
    4 only; their raw partitions are in check 6).
    """
    behind = behind or {}
    an = Anomalies()
    dead = [d for d in delivered if d.topic == dlq_topic]
    retried = [d for d in delivered if d.topic == retry_topic]
    delivered = [d for d in delivered if d.topic not in (dlq_topic, retry_topic)]
    # ---- indexes
    where: dict[str, tuple[tuple[str, int], int]] = {}
    for tp, rp in raw.items():
        if tp[0] in (dlq_topic, retry_topic):
            continue  # copies of inputs: an id is found where its input is
        for rec in rp.records:
            if rec.value is not None:
                where.setdefault(rec.value["id"], (tp, rec.offset))
    vis_count: Counter[str] = Counter()
    vis_by_txn: dict[str, list[Delivered]] = defaultdict(list)
    for d in delivered:
        if d.value is None:
            continue
        vis_count[d.value["id"]] += 1
        if d.value.get("txn"):
            vis_by_txn[d.value["txn"]].append(d)
    records_checked = len(delivered)

    # ---- 1, 2: txns against beliefs
    txns: Counter[str] = Counter()
    out_ids: set[str] = set()  # records of committed txns their writers were told are out
    all_txns = set(truth.opens) | set(truth.sent) | set(truth.ends)
    for txn in sorted(all_txns):
        exp = truth.expected(txn)
        txns[exp] += 1
        recs = truth.sent.get(txn, [])
        records_checked += len(recs)
        ids = {r[0] for r, _ in recs}
        seen = sum(1 for rid in ids if vis_count[rid])
        out = truth.excluded.get(txn, set())
        out_of_txn = {rid for rid in ids if rid not in truth.unsure
                      and _place(where.get(rid)) in out}
        matched = {_place(where.get(rid)) for rid in ids}
        for place in sorted(out - matched):
            if (place[0], place[1]) in raw:  # (a deleted topic's records are not read)
                an.add("excluded_offset_unmatched", {
                    "txn": txn, "at": "{}-{}@{}".format(*place),
                    "holds": _holds(raw, place)})
        if exp == "contradictory":
            an.add("contradictory_outcomes", {"txn": txn, "ends": truth.ends[txn],
                                              "admin": truth.admin.get(txn)})
        elif exp == "committed":
            out_ids |= out_of_txn
            for r, how in recs:
                rid = r[0]
                if rid in truth.unsure:
                    continue  # its writer does not know: neither demanded nor forbidden
                if rid in out_of_txn:
                    if vis_count[rid]:
                        tp, off = where[rid]
                        an.add("excluded_record_visible", {
                            "txn": txn, "id": rid, "at": f"{tp[0]}-{tp[1]}@{off}",
                            "how": how or "co-write", "times": vis_count[rid],
                            "first_marker": raw[tp].first_marker.get(txn)},
                            sub="committed read")
                    continue
                if vis_count[rid] == 0:
                    why = _diagnose(rid, txn, where, raw, how)
                    an.add("committed_record_missing", {
                        "txn": txn, "id": rid, "partition": f"{r[1]}-{r[2]}", "why": why,
                        "visible_of_txn": seen, "records_of_txn": len(ids),
                        "raw_offset": where.get(rid, (None, None))[1],
                        "first_marker": raw.get((r[1], r[2]), RawPartition(r[1], r[2]))
                        .first_marker.get(txn)}, sub=why)
            for d in vis_by_txn.get(txn, ()):
                assert d.value is not None
                if d.value["id"] not in ids:
                    an.add("record_of_unlogged_txn", {"txn": txn, "id": d.value["id"],
                                                      "note": "not logged as sent"})
        elif exp == "aborted":
            for d in vis_by_txn.get(txn, ()):
                assert d.value is not None
                an.add("aborted_record_visible", {
                    "txn": txn, "id": d.value["id"], "at": f"{d.topic}-{d.partition}@{d.offset}",
                    "ends": truth.ends.get(txn), "admin": truth.admin.get(txn)})
        else:
            ids -= truth.unsure | out_of_txn  # all or nothing: of the records said in
            seen = sum(1 for rid in ids if vis_count[rid])
            if 0 < seen < len(ids):
                an.add("unknown_txn_partial", {"txn": txn, "visible": seen, "records": len(ids),
                                               "ends": truth.ends.get(txn)})
            if ids and seen == len(ids) and truth.client_status(txn) == "ABORTED":
                an.add("reported_aborted_but_committed", {"txn": txn,
                                                          "end": truth.ends[txn][-1]})
    for rid, n in vis_count.items():
        if n > 1:
            an.add("duplicate_record", {"id": rid, "times": n})
    for txn in vis_by_txn:
        if txn not in truth.opens:
            an.add("record_of_unlogged_txn", {"txn": txn, "id": vis_by_txn[txn][0].value
                                              and vis_by_txn[txn][0].value["id"]})
    for txn, opens in truth.opens.items():
        if len(opens) > 1:
            an.add("txn_id_issued_twice", {"txn": txn, "to": [o["by"] for o in opens]})

    # ---- 3: order
    last_off: dict[tuple[str, int], int] = {}
    last_seq: dict[tuple[str, int, str], int] = {}
    for d in delivered:
        k = (d.topic, d.partition)
        if d.offset <= last_off.get(k, -1):
            an.add("order_violation", {"at": f"{d.topic}-{d.partition}@{d.offset}",
                                       "after_offset": last_off[k]}, sub="offset")
        last_off[k] = max(d.offset, last_off.get(k, -1))
        if d.value is not None and "w" in d.value:
            ks = (d.topic, d.partition, d.value["w"])
            if d.value["s"] <= last_seq.get(ks, -1):
                an.add("order_violation", {"at": f"{d.topic}-{d.partition}@{d.offset}",
                                           "writer": d.value["w"], "seq": d.value["s"],
                                           "after_seq": last_seq[ks]}, sub="sequence")
            last_seq[ks] = max(d.value["s"], last_seq.get(ks, -1))

    # ---- 4: processors
    inputs = {d.value["id"]: d for d in delivered if d.topic == in_topic and d.value}
    outs_per_input: Counter[str] = Counter()
    outs_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in delivered:
        if d.topic == out_topic and d.value and "in" in d.value:
            outs_per_input[d.value["in"]] += 1
            if len(outs_of[d.value["in"]]) < 3:
                outs_of[d.value["in"]].append(d.value)
            if d.value["in"] not in inputs:
                an.add("output_without_input", {"out": d.value["id"], "in": d.value["in"]})
    dead_of: Counter[str] = Counter(d.value["id"] for d in dead if d.value)
    for d in dead:
        if d.value and d.value["id"] not in inputs:
            an.add("dead_letter_without_input", {"at": f"{d.topic}-{d.partition}@{d.offset}",
                                                 "in": d.value["id"]})
    for d in retried:
        if d.value and d.value["id"] not in inputs:
            an.add("retry_letter_without_input", {"at": f"{d.topic}-{d.partition}@{d.offset}",
                                                  "in": d.value["id"]})
    for iid, d in inputs.items():
        n, gone = outs_per_input[iid], dead_of[iid]
        if n == 0 and gone == 0:
            why = _reach(behind.get("processors"), d.topic, d.partition, d.offset)
            an.add("input_not_processed", {"in": iid, "at": f"{d.topic}-{d.partition}@{d.offset}",
                                           "why": why}, sub=why)
        elif n > 1:
            an.add("input_processed_twice", {"in": iid, "outputs": n,
                                             "by": [(o["w"], o["txn"]) for o in outs_of[iid]]})
        if gone > 1:
            an.add("input_dead_lettered_twice", {"in": iid, "dead_letters": gone})
        if gone and n:
            an.add("input_processed_and_dead_lettered", {
                "in": iid, "outputs": n, "by": [(o["w"], o.get("txn")) for o in outs_of[iid]]})

    # ---- 5: committed-only consumers
    for rid in vis_count:
        if not truth.received[rid]:
            loc = where.get(rid)
            why = "not in the partition" if loc is None else _reach(
                behind.get("consumers"), loc[0][0], loc[0][1], loc[1])
            an.add("consumer_missed_record", {"id": rid, "why": why, "at": None if loc is None
                                              else f"{loc[0][0]}-{loc[0][1]}@{loc[1]}"}, sub=why)
    for rid, rtxn in truth.received_txn.items():
        if rtxn is not None and truth.expected(rtxn) == "aborted":
            an.add("consumer_saw_aborted", {"id": rid, "txn": rtxn})
        if rid in out_ids:
            an.add("excluded_record_visible", {"id": rid, "txn": rtxn,
                                               "times": truth.received[rid]}, sub="consumer")

    # ---- 6: raw agreement
    kinds_by_txn: dict[str, set[str]] = defaultdict(set)
    for rp in raw.values():
        for txn, (kind, _) in rp.first_marker.items():
            kinds_by_txn[txn].add(kind)
        # A forged record's txn.id (never issued, a live txn's without its tag, a tag
        # copied to another partition) is junk to readers: no marker ever follows it.
        txn_records = {r.txn for r in rp.records if r.marker is None and r.txn
                       and not r.forged}
        for txn in txn_records - set(rp.first_marker):
            an.add("txn_without_marker", {"txn": txn, "partition": f"{rp.topic}-{rp.partition}",
                                          "expected": truth.expected(txn)})
    for txn, kinds in kinds_by_txn.items():
        if len(kinds) > 1:
            parts = {f"{rp.topic}-{rp.partition}": rp.first_marker[txn][0]
                     for rp in raw.values() if txn in rp.first_marker}
            an.add("split_outcome", {"txn": txn, "markers": parts,
                                     "belief": truth.expected(txn)})

    # ---- 7: forged records and the line
    for d in delivered:
        if d.value is not None and d.value.get("forged"):
            an.add("forged_record_visible", {"at": f"{d.topic}-{d.partition}@{d.offset}",
                                             "txn": d.txn, "value": d.value},
                   sub=f"committed read: {d.value.get('kind')}")
    for rid in truth.received:
        if rid.startswith("forged-"):
            an.add("forged_record_visible", {"id": rid, "txn": truth.received_txn.get(rid)},
                   sub="consumer")
    for ev in truth.intrusions:
        an.add("line_intrusion", ev, sub=f"{ev.get('who')} {ev.get('op')}")

    visible = Counter(d.topic for d in delivered)
    intruder: Counter[str] = Counter()
    for counts in truth.intruder_counts.values():
        intruder.update(counts)
    sent_how = Counter(how for recs in truth.sent.values() for r, how in recs
                       if r[0] not in truth.unsure)
    foreign = Counter((e.get("error") or "returned").split(":")[0]
                      for ends in truth.ends.values() for e in ends if e.get("want") == "foreign")
    notes: dict[str, Any] = {"late_sends_rejected": truth.late_rejected,
             "late_sends_accepted": sent_how["late"] - truth.excluded_how["late"],
             "late_sends_excluded": truth.excluded_how["late"],
             "foreign_commits": sum(1 for ends in truth.ends.values() for e in ends
                                    if e.get("want") == "cocommit"
                                    and e.get("outcome") == "committed"),
             "foreign_opener_commits_returned": foreign.pop("returned", 0),
             "foreign_opener_commits_excluded": foreign.pop("RecordsExcludedError", 0),
             "foreign_opener_commits_other_error": sum(foreign.values()),
             "foreign_records_sent_after": sent_how["foreign"],
             "foreign_records_excluded": truth.excluded_how["foreign"],
             "records_fate_unknown": len(truth.unsure),
             "processor_redeliveries_seen": truth.regressions,
             "processor_duplicate_deliveries_in_a_batch": truth.dup_in_batch,
             "consumer_records_received": sum(truth.received.values()),
             "processor_outputs_logged": len(truth.pairs),
             "processor_inputs_dead_lettered": len(dead_of),
             "processor_retry_letters": len(retried)}
    if intruder:
        notes["intruder_requests"] = dict(sorted(intruder.items()))
    flood: Counter[str] = Counter()
    for counts in truth.flood_counts.values():
        flood.update(counts)
    if flood:
        notes["flood_requests"] = dict(sorted(flood.items()))
    return CheckResult(an, txns, records_checked, visible,
                       sum(len(rp.records) for rp in raw.values()), notes)
