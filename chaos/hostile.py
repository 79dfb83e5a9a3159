"""The hostile profiles' role processes: the intruder and the flood, with their specs."""

from __future__ import annotations

from typing import Any

from chaos.credentials import FLOODER, GROUPS, STRANGER, Credentials
from chaos.profile import Profile

__all__ = ["hostile_roles"]


def hostile_roles(p: Profile, creds: Credentials, topics: list[str]
                  ) -> list[tuple[str, str, dict[str, Any], str]]:
    """``(name, role, spec, principal)`` of each hostile process of profile ``p``."""
    if not p.hostile:
        return []
    return [
        ("intruder-0", "intruder", {"topics": topics, "rate": p.intruder_rate, "forge": True,
                                    "pause_s": p.pause_s}, STRANGER),
        ("flooder-0", "flooder", {
            "quiet_s": p.workload_s * p.flood_quiet_share,
            "list_connections": p.flood_list_connections,
            "list_window": p.flood_list_window, "own_txns": p.flood_own_txns,
            "evict_rate": p.flood_evict_rate, "rate": p.flood_rate,
            "idle_sockets": p.flood_idle_sockets, "idle_hosts": p.flood_idle_hosts,
            "tarpit_records": p.flood_tarpit_records, "pause_s": p.pause_s,
            "groups_secret_file": str(creds.secret_file(GROUPS))}, FLOODER),
    ]
