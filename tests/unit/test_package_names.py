"""``txnstream``'s public names load when first used, and a part loads without the rest.

Spark starts a fresh Python process for every streaming query's source
(docs/spark.md), which imports the source's modules only: the client, the consumer and
the metrics (prometheus_client) must not come with them.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import txnstream


def test_every_public_name_is_its_home_modules_object():
    for name in txnstream.__all__:
        home = importlib.import_module(f"txnstream.{txnstream._HOMES[name]}")
        assert getattr(txnstream, name) is getattr(home, name)
    assert set(txnstream._HOMES) == set(txnstream.__all__)
    assert set(txnstream.__all__) <= set(dir(txnstream))


def test_an_unknown_name_is_an_attribute_error():
    try:
        txnstream.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("txnstream.NoSuchName did not raise")


def test_the_spark_source_imports_neither_client_nor_metrics():
    code = ("import sys, txnstream_spark.datasource, txnstream_spark.planner, "
            "txnstream.buffer.follower, txnstream.buffer.recreation; "
            "print(sorted(m for m in ('txnstream.client', 'txnstream.consumer', "
            "'txnstream.metrics', 'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
