#!/usr/bin/env bash
# STAND-IN for Kafka's bin/kafka-storage.sh: kafka.tools.StorageTool.
exec "$(dirname "$0")/kafka-run-class.sh" kafka.tools.StorageTool "$@"
