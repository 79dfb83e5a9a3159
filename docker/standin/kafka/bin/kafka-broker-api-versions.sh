#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-broker-api-versions.sh: org.apache.kafka.tools.BrokerApiVersionsCommand.
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
