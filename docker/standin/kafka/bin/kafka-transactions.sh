#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-transactions.sh: org.apache.kafka.tools.TransactionsCommand.
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.TransactionsCommand "$@"
