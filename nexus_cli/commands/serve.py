"""nexus serve (being built: see the issue tracker)."""

from ..errors import NexusError


def serve_command() -> None:
    raise NexusError("nexus serve is not built yet")
