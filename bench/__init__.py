"""Benchmarks: txnstream side by side with its anchors, in one run, on one broker."""
