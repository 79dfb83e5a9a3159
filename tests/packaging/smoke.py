"""Run by the interpreter of a fresh venv that installed the wheel, outside the checkout.

Checks what a user's first minute touches: every module imports, every schema the codec
knows encodes and decodes, the Spark integration is ``txnstream_spark`` and nothing
installs as ``spark``. Prints ``SMOKE OK`` last.
"""

import importlib
import importlib.util
import json
import pkgutil
import sys

from fastavro.utils import generate_many

import txnstream
import txnstream_spark
from txnstream.codec import SCHEMA_DIR, codec

assert "site-packages" in txnstream.__file__, f"txnstream imported from {txnstream.__file__}"
assert "site-packages" in txnstream_spark.__file__, txnstream_spark.__file__
assert importlib.util.find_spec("spark") is None, "a top-level 'spark' package is installed"

modules = []
for pkg in (txnstream, txnstream_spark):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
        modules.append(info.name)

names = sorted(p.name.removesuffix(".avsc") for p in SCHEMA_DIR.iterdir()
               if p.name.endswith(".avsc"))
assert len(names) >= 10, f"schemas in the wheel: {names}"
for name in names:
    # a record generated from the schema itself, through the installed codec and back
    c = codec(name)
    record = next(generate_many(json.loads((SCHEMA_DIR / f"{name}.avsc").read_text()), 1))
    data = c.encode(record)  # bytes compared: a generated float may be NaN or float32
    assert c.encode(c.decode(data)) == data, f"{name}: round trip changed the record"

from txnstream.markers import MarkerKind, TxnMarker  # noqa: E402
from txnstream.types import TxnID  # noqa: E402

marker = TxnMarker(TxnID(3, 77), MarkerKind.COMMIT, 5)
assert TxnMarker.decode(marker.encode()) == marker, "txn_marker round trip"

print(json.dumps({"modules": len(modules), "schemas": names, "python": sys.executable}))
print("SMOKE OK")
