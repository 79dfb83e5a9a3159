"""The thin Kafka layer: what txnstream needs of confluent-kafka, knowing nothing of txns.

* :mod:`~txnstream.kafka.partitioning`: Java's murmur2 and default partition, so keys
  land where Java clients put them;
* :mod:`~txnstream.kafka.topics`: does a topic or partition exist (a rate-limited
  catalog), the settings that never auto-create one, "gone" produce errors;
* :mod:`~txnstream.kafka.fetch`: consume helpers that never sit on what has arrived.

Everything above it (the coordinator, the buffer, pending acks, the client) builds on
these; nothing here imports them.
"""
