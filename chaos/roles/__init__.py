"""The harness's role processes, each started as ``python -m chaos.roles ROLE ...``.

``producer``: opens multi-partition txns, co-writes into its peer's txns (the peer is
another process that attaches to the same TxnID), aborts some on purpose, leaves some
to time out. ``processor``: consume-transform-produce exactly once (acks and outputs in
one txn; individual or cumulative acks). ``consumer``: committed-only reads with plain
acks. Each appends what it believes to its own truth file (:mod:`chaos.truth`).
"""
