#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-run-class.sh: java with /opt/kafka/libs/* on the classpath,
# honouring KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_LOG4J_OPTS and KAFKA_OPTS.
set -euo pipefail
base_dir=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC2086  # the *_OPTS variables are word lists, as in Kafka's script
exec java ${KAFKA_HEAP_OPTS:--Xmx256M} \
  ${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true} \
  ${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base_dir/config/tools-log4j2.yaml} \
  ${KAFKA_OPTS:-} -cp "$base_dir/libs/*" "$@"
