"""``Client.close()``: everything it made is closed even if one fails; the first failure
is raised after, but never over the error that ended a ``with`` block."""

from __future__ import annotations

import pytest

from txnstream import Client, Config


class _Made:
    """A producer or consumer as ``Client.close()`` sees one: something to close."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.closed = 0

    def close(self) -> None:
        self.closed += 1
        if self.fails:
            raise RuntimeError("broker gone")


def _client(*made: _Made) -> Client:
    client = Client(config=Config(bootstrap_servers="127.0.0.1:1"))  # never connects here
    for m in made:
        client._made.add(m)  # type: ignore[arg-type]
    return client


def test_close_closes_every_one_and_raises_the_failure_after():
    good, bad, other = _Made(), _Made(fails=True), _Made()
    client = _client(good, bad, other)
    with pytest.raises(RuntimeError, match="broker gone"):
        client.close()
    assert (good.closed, bad.closed, other.closed) == (1, 1, 1)
    client.close()  # nothing left to close
    assert (good.closed, bad.closed, other.closed) == (1, 1, 1)


def test_a_failing_close_never_hides_the_error_that_ended_the_with_block():
    bad = _Made(fails=True)
    with pytest.raises(ValueError, match="the body's"), _client(bad):
        raise ValueError("the body's")
    assert bad.closed == 1


def test_a_clean_with_block_raises_the_close_failure():
    bad = _Made(fails=True)  # held: the client keeps only weak references
    with pytest.raises(RuntimeError, match="broker gone"), _client(bad):
        pass
    assert bad.closed == 1
