"""nexus compile (being built: see the issue tracker)."""

from ..errors import NexusError


def compile_command() -> None:
    raise NexusError("nexus compile is not built yet")
