"""The error types of Nexus. They are mapped to one red line and an exit code once, in cli.main()."""

from __future__ import annotations


class NexusError(Exception):
    """A runtime error with a message meant for the user (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(NexusError):
    """The command line itself is wrong (exit code 2)."""

    exit_code = 2


class NativeError(NexusError):
    """libnexus returned a non-zero status; the message is the library's own."""

    def __init__(self, status: int, message: str):
        super().__init__(message or f"libnexus error {status}")
        self.status = status


class FormatError(NexusError):
    """A file (block, registry, index, session) is malformed or does not match."""


class ModelError(NexusError):
    """A model is missing, corrupt or does not match what a file was built with."""


class SchemaError(NexusError):
    """A tool's JSON schema cannot be turned into a signature or grammar."""
