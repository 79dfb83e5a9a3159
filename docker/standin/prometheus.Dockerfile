# STAND-IN for prom/prometheus (the tag docker-compose.yml names), for machines that cannot
# pull public images (tools/compose-test, docker-compose.standin.yml): Debian bookworm's
# `prometheus` package, laid out as the real image is: ENTRYPOINT /bin/prometheus with the
# real image's default flags as CMD, config in /etc/prometheus/prometheus.yml, data in
# /prometheus (the working directory), user nobody, port 9090. Debian's binary defaults
# --storage.tsdb.path to /var/lib/prometheus/metrics2 (the real one: data/, that is
# /prometheus/data), so that path leads to /prometheus/data. Differences: Debian's
# Prometheus 2.42 (the compose file names 2.55), Debian's console templates paths.
ARG BASE_IMAGE=txnstream-standin/debian:bookworm
FROM ${BASE_IMAGE}
# The package's service must not start during the build: policy-rc.d says no (101).
# hadolint ignore=DL3008
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && mkdir -p /prometheus/data && chown -R nobody:nogroup /prometheus \
    && rm -rf /var/lib/prometheus/metrics2 \
    && ln -s /prometheus/data /var/lib/prometheus/metrics2
# The real image runs as nobody by name, as here.
# hadolint ignore=DL3066
USER nobody
EXPOSE 9090
VOLUME ["/prometheus"]
WORKDIR /prometheus
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.console.libraries=/usr/share/prometheus/console_libraries", \
     "--web.console.templates=/usr/share/prometheus/consoles"]
