"""Apache Spark integration: the ``txnstream`` Python data source (source and sink)."""
