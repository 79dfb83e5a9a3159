# The Spark example pipeline (committed-only source -> exactly-once sink), local[2] Spark
# in one container: Java 17 for Spark, txnstream[spark] from the project's wheel.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE} AS build
# A C compiler for the buffer owner's native scan and send_batch's native send
# (txnstream/_native.c, txnstream/_native_send.c, docs/architecture.md "Native code"): the
# wheel carries them built. They are optional to pip, so the last line fails the build if
# the wheel lacks one, rather than ship the Python path.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY txnstream ./txnstream
COPY spark ./spark
RUN pip install --no-cache-dir build==1.2.2.post1 \
    && python -m build --wheel --outdir /dist \
    && python -c "import glob, sys, zipfile; names = zipfile.ZipFile(glob.glob('/dist/*.whl')[0]) \
       .namelist(); sys.exit(not all(any(n.startswith(f'txnstream/{m}.') for n in names) \
       for m in ('_native', '_native_send')))"

FROM ${PYTHON_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless=17.* \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /dist /dist
# the project's own wheel, just built; its dependencies are pinned by its metadata.
# pip's cache is a BuildKit cache mount (kept by the builder, not in the image): PyPI has
# pyspark as a source distribution only, and building its wheel is most of this step, so a
# rebuild after a change to the sources reuses the wheel built the first time.
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    whl=$(ls /dist/*.whl) && pip install "${whl}[spark]" && rm -rf /dist
RUN useradd --create-home --uid 1000 spark && mkdir /checkpoints && chown spark /checkpoints
USER 1000
ENTRYPOINT ["python", "-m", "txnstream_spark.example_pipeline"]
