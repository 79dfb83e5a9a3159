"""The C part of txnstream: the buffer owner's scan (txnstream/_native.c).

Everything else is in pyproject.toml. The extension is optional: without a C compiler
the package installs and folds through Python (txnstream.buffer.scan).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("txnstream._native", ["txnstream/_native.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall"],
                             optional=True)])
