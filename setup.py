"""The C part of txnstream: the buffer owner's scan (txnstream/_native.c) and
``Producer.send_batch``'s native send (txnstream/_native_send.c).

Everything else is in pyproject.toml. Both extensions are optional: without a C compiler
the package installs, folds through Python (txnstream.buffer.scan) and sends through
confluent-kafka (txnstream.producer).
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-std=c11", "-Wall"]

setup(ext_modules=[
    Extension("txnstream._native", ["txnstream/_native.c"], extra_compile_args=FLAGS,
              optional=True),
    Extension("txnstream._native_send", ["txnstream/_native_send.c"],
              extra_compile_args=[*FLAGS, "-D_GNU_SOURCE"], extra_link_args=["-pthread"],
              optional=True),
])
