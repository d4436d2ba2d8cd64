"""nexus index (being built: see the issue tracker)."""

from ..errors import NexusError


def index_command() -> None:
    raise NexusError("nexus index is not built yet")
