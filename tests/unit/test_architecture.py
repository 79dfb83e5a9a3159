"""docs/architecture.md tells the truth: every module is named there, imports go down.

The layers are the doc's table; a module imports only from its own layer or below
(every import counted, as in ``test_import_graph.py``).
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_import_graph import ROOT, graph

DOC = ROOT / "docs" / "architecture.md"

LAYERS: dict[str, int] = {
    # 0. foundations
    "txnstream.types": 0, "txnstream.errors": 0, "txnstream.config": 0,
    "txnstream.validate": 0, "txnstream.codec": 0, "txnstream.ratelog": 0,
    "txnstream.metrics": 0, "txnstream.message": 0, "txnstream.markers": 0,
    "txnstream.membership": 0, "txnstream.workers_key": 0, "txnstream.native": 0,
    # 1. Kafka
    "txnstream.kafka": 1, "txnstream.cluster": 1,
    # 2. pure state
    "txnstream.coordinator.log_entry": 2, "txnstream.coordinator.meta": 2,
    "txnstream.coordinator.txn_table": 2, "txnstream.coordinator.epochs": 2,
    "txnstream.coordinator.txn_index": 2,
    "txnstream.coordinator.group_outcomes": 2, "txnstream.coordinator.metadata_store": 2,
    "txnstream.coordinator.timeout_tracker": 2, "txnstream.coordinator.protocol": 2,
    "txnstream.coordinator.request_checks": 2,
    "txnstream.buffer.offset_runs": 2, "txnstream.buffer.transaction_buffer": 2,
    "txnstream.buffer.snapshot": 2, "txnstream.buffer.served": 2, "txnstream.buffer.vouch": 2,
    "txnstream.buffer.unregistered": 2, "txnstream.buffer.runs": 2,
    "txnstream.buffer.delays": 2,
    "txnstream.pendingack": 2, "txnstream.delivery": 2, "txnstream.delayed": 2,
    "txnstream.fencing": 2,
    # 3. storage on Kafka
    "txnstream.coordinator.txn_log": 3, "txnstream.buffer.snapshot_store": 3,
    "txnstream.buffer.follower": 3, "txnstream.pendingack.store": 3,
    "txnstream.pendingack.replay": 3,
    "txnstream.admin_topics": 3,
    # 4. the line
    "txnstream.coordinator.line_security": 4, "txnstream.coordinator.transport": 4,
    "txnstream.coordinator.ioloop": 4,
    "txnstream.coordinator.endpoints": 4, "txnstream.coordinator.txn_ids": 4,
    "txnstream.coordinator.tc_client": 4, "txnstream.coordinator.client_connection": 4,
    # 5. server roles (the rest of coordinator/ and buffer/)
    "txnstream.coordinator": 5, "txnstream.buffer": 5,
    # 6. client API
    "txnstream.pipeline": 6, "txnstream.fate": 6, "txnstream.txn_handle": 6,
    "txnstream.transaction": 6,
    "txnstream.send_paths": 6, "txnstream.producer": 6,
    "txnstream.consumer_group": 6, "txnstream.take_plan": 6,
    "txnstream.predecessors": 6, "txnstream.consumer_txns": 6,
    "txnstream.consumer": 6, "txnstream.lifecycle": 6, "txnstream.ingest": 6,
    "txnstream.admin": 6, "txnstream.arrow": 6,
    # 7. composition; 8-9. tools
    "txnstream": 7, "txnstream.client": 7,
    "txnstream.processor": 8, "txnstream.top": 8, "txnstream.two_phase": 8,
    "txnstream.cli": 9, "txnstream.demo": 9,
}


def layer(module: str) -> int:
    name = module
    while name not in LAYERS:
        name = name.rpartition(".")[0]
    return LAYERS[name]


def test_imports_go_down_the_layers():
    up = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                for m, targets in graph().items() for t in targets if layer(t) > layer(m))
    assert up == [], "imports that go up a layer:\n" + "\n".join(up)


def test_every_module_is_named_in_the_architecture_doc():
    text = DOC.read_text()
    missing = []
    for pkg in ("txnstream", "spark"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.name == "__init__.py":
                continue
            dirs = [f"`{Path(*rel.parts[:i]).as_posix()}/`" for i in range(2, len(rel.parts))]
            if f"`{rel.as_posix()}`" not in text and not any(d in text for d in dirs):
                missing.append(rel.as_posix())
    assert missing == [], f"modules docs/architecture.md does not name: {missing}"
