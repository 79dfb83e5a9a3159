"""The ``txnstream`` Spark data source (PySpark 4.x Python Data Source API).

Registered as format ``"txnstream"``: reads committed records only
(:mod:`txnstream_spark.source`, planned by :mod:`txnstream_spark.planner`) and writes
exactly once (:mod:`txnstream_spark.sink`). This class only hands the options to them.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from txnstream.errors import ConfigError

from .options import SourceOptions
from .schema import SCHEMA, layout
from .sink import TxnStreamBatchWriter, TxnStreamStreamWriter
from .source import TxnStreamBatchReader, TxnStreamStreamReader

__all__ = ["TxnStreamDataSource"]


class TxnStreamDataSource(DataSource):
    """Register with ``spark.dataSource.register(TxnStreamDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "txnstream"

    def schema(self) -> StructType | str:
        # Resolved at load(): bad read options fail here, naming the option, before any
        # plan or task exists.
        if "subscribe" in self.options:
            return layout(SourceOptions.parse(dict(self.options)).value_schema)[0]
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxnStreamBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TxnStreamStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:  # Kafka's sink refuses it the same way: a topic is appended to
            raise ConfigError("Save mode Overwrite not allowed for txnstream. Allowed save "
                              "modes are Append and ErrorIfExists (default).")
        return TxnStreamBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return TxnStreamStreamWriter(dict(self.options), schema)
