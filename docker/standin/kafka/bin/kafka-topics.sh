#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-topics.sh: org.apache.kafka.tools.TopicCommand.
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.TopicCommand "$@"
