"""nexus route (being built: see the issue tracker)."""

from ..errors import NexusError


def route_command() -> None:
    raise NexusError("nexus route is not built yet")
