# STAND-IN for apache/kafka (the tag docker-compose.yml names), for machines that cannot
# pull public images (tools/compose-test, docker-compose.standin.yml). Same entry point
# (/etc/kafka/docker/run), environment variables (KAFKA_*, CLUSTER_ID), port (9092), user
# (appuser), volumes and /opt/kafka/bin tools the compose file uses. Differences from the
# real image: Debian bookworm with Debian's OpenJDK 17 (the real one: Alpine with Temurin
# 21); the jars come from Maven Central (docker/standin/kafka/pom.xml), not the release
# tarball, so /opt/kafka/bin holds only the tools listed below (Kafka's own classes run
# them) and there is no Connect, no JMX option handling and no CDS archive.
# Build context (tools/compose-test stages it): this folder's kafka/ files and libs/.
ARG BASE_IMAGE=txnstream-standin/debian:bookworm
FROM ${BASE_IMAGE}
# Debian's Java 17 of the mirror the base image was made from.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --shell /bin/bash appuser \
    && mkdir -p /opt/kafka/config /var/lib/kafka/data /etc/kafka/secrets /etc/kafka/docker \
       /mnt/shared/config \
    && chown appuser:appuser -R /opt/kafka /mnt/shared/config \
    && chown appuser:root -R /var/lib/kafka /etc/kafka \
    && chmod -R ug+w /etc/kafka /var/lib/kafka
COPY libs /opt/kafka/libs
COPY kafka/bin /opt/kafka/bin
COPY --chown=appuser:appuser kafka/config /opt/kafka/config
COPY --chown=appuser:appuser kafka/config /etc/kafka/docker
COPY --chown=appuser:appuser kafka/run /etc/kafka/docker/run
# The real image runs as its user by name, as here.
# hadolint ignore=DL3066
USER appuser
EXPOSE 9092
VOLUME ["/etc/kafka/secrets", "/var/lib/kafka/data", "/mnt/shared/config"]
CMD ["/etc/kafka/docker/run"]
