"""The data source's former import path, kept for existing code: see :mod:`.datasource`.

Split into :mod:`.schema` (the rows' columns), :mod:`.planner` (the driver's plan),
:mod:`.source` (the readers and the task-side filter) and :mod:`.sink` (the writers).
"""

from .datasource import TxnStreamDataSource
from .schema import SCHEMA

__all__ = ["TxnStreamDataSource", "SCHEMA"]
