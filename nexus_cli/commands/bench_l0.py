"""nexus bench l0: not built yet in this commit."""

from ..errors import NexusError


def command() -> None:
    raise NexusError("this suite is not built yet")
