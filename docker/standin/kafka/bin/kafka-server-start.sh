#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-server-start.sh: the broker (kafka.Kafka) with 1 GB of heap
# and the broker's log4j2.yaml, as Kafka's script sets them unless overridden.
base_dir=$(cd "$(dirname "$0")/.." && pwd)
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
export KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base_dir/config/log4j2.yaml}"
exec "$base_dir/bin/kafka-run-class.sh" kafka.Kafka "$@"
