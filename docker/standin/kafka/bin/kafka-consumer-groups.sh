#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-consumer-groups.sh: org.apache.kafka.tools.consumer.group.ConsumerGroupCommand.
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand "$@"
