"""No authenticated name aliases the unauthenticated ``anonymous``, and no group key
reaches into another principal's scope (issue 34 item 6).

A worker that authenticates nobody keeps group keys as clients name them; an
authenticating one scopes each key as ``principal`` U+001F ``key``. A principal named
``anonymous`` (a users-file line, a certificate's common name) kept its keys unscoped on
an authenticating worker, and a key holding U+001F could spell another principal's scoped
key: together they ended another principal's Spark batch.
"""

from __future__ import annotations

import time

import pytest

from txnstream.config import load_tc_users
from txnstream.coordinator.protocol import GROUP_SCOPE, TcOp, TcRequest
from txnstream.coordinator.request_checks import check_request
from txnstream.errors import ConfigError, InvalidRequestError


def _end_group(key: str) -> TcRequest:
    return TcRequest("r1", "c", 0, TcOp.END_GROUP, 0, int(time.time() * 1000) + 60_000,
                     group_key=key, group_seqs=(1,))


@pytest.mark.parametrize("key", [f"alice{GROUP_SCOPE}query-7/12", f"{GROUP_SCOPE}x", "a\x00b"])
def test_a_group_key_with_a_control_character_is_refused_naming_it(key):
    with pytest.raises(InvalidRequestError, match="group_key") as err:
        check_request(_end_group(key), 60_000, 100)
    assert "control character" in str(err.value)


def test_an_ordinary_group_key_passes():
    check_request(_end_group("5c1f0e2a-query/12"), 60_000, 100)


def test_a_users_file_may_not_name_the_unauthenticated_principal(tmp_path):
    users = tmp_path / "users"
    users.write_text("alice=a1ice-secret\nanonymous=guessable\n")
    with pytest.raises(ConfigError, match="line 2") as err:
        load_tc_users(users)
    assert "'anonymous'" in str(err.value) and "guessable" not in str(err.value)
