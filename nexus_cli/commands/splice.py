"""nexus splice (being built: see the issue tracker)."""

from ..errors import NexusError


def splice_command() -> None:
    raise NexusError("nexus splice is not built yet")
