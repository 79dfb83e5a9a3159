"""Broker ports (the nemesis harness's, the suite's) stay out of the kernel's ephemeral range.

A killed broker restarts on its own ports; in the ephemeral range any outgoing
connection can take one meanwhile (a 30-minute soak lost a broker that way).
"""

from chaos.cluster import CONTROLLER_OFFSET, ephemeral_ports, free_port_block


def test_broker_ports_are_below_the_ephemeral_range():
    low, _ = ephemeral_ports()
    for _ in range(20):
        base = free_port_block(3)
        assert 1024 <= base and base + CONTROLLER_OFFSET + 2 < low


def test_role_ports_are_below_the_ephemeral_range():
    from chaos.cluster import free_port

    low, _ = ephemeral_ports()
    assert all(1024 <= free_port() < low for _ in range(20))


def test_the_suites_broker_ports_are_below_the_ephemeral_range():
    """The suite's brokers too: a port picked free can be taken as an outgoing connection's
    before the JVM binds it (CI lost a 3-broker test to that: "Address already in use")."""
    from tests.conftest import _free_port_pair

    low, _ = ephemeral_ports()
    for _ in range(20):
        port = _free_port_pair()
        assert 1024 <= port and port + CONTROLLER_OFFSET < low, port
