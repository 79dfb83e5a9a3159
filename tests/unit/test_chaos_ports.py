"""The nemesis harness's broker ports stay out of the kernel's ephemeral range.

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
