# STAND-IN for python:3.11-slim-bookworm, for machines that cannot pull public images
# (tools/compose-test). Debian bookworm's own Python 3.11 from the debootstrapped base
# image, with `python`, `pip` and a system-wide `pip install` as the real image allows.
# Differences from the real image: Debian's CPython 3.11.2 in /usr/bin (not 3.11.x built
# into /usr/local), Debian's pip; and pip trusts the CA bundle of the machine that built
# it (ca-certificates.crt from the build context), which this machine needs to reach PyPI.
# CPython's headers are there as in the real image (which ships them in /usr/local/include):
# the project's build stage compiles its C extension against them.
ARG BASE_IMAGE=txnstream-standin/debian:bookworm
FROM ${BASE_IMAGE}
COPY ca-certificates.crt /usr/local/share/ca-certificates-build/ca-certificates.crt
# Debian's packages of the mirror the base image was made from: versions are whatever
# bookworm carries, as in the real image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \
       python-is-python3 libpython3-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
ENV PIP_CERT=/usr/local/share/ca-certificates-build/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LANG=C.UTF-8
CMD ["python3"]
