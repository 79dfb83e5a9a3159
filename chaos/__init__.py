"""A nemesis harness for txnstream (issue 11): ``python -m chaos`` / ``make chaos``.

On its own 3-broker cluster it runs transactional producers that share txns across
processes, exactly-once processors, committed-only consumers and admin aborts while a
nemesis kill -9s and SIGSTOPs coordinator workers, processors and consumers and
kill -9s a broker; then a checker reads everything back (raw and committed-only) and
counts anomalies. See ``docs/chaos.md``.
"""
