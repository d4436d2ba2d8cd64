"""Arguments: a chosen tool's arguments generated under its grammar, repaired and validated.

Entry point: `generate_arguments` (pipeline.py), the one pipeline every command calls. prompt.py builds what the
model reads, prefixes.py keeps each tool's shared prompt prefix as a KV state, repairs.py mends the answer, guessed.py
names the required values the request does not give.
"""

from .pipeline import ArgsResult, PromptCache, generate_arguments
from .prefixes import ArgumentPrefixes, common_prefix
from .prompt import build_messages, prune_history

__all__ = ["ArgsResult", "ArgumentPrefixes", "PromptCache", "build_messages", "common_prefix", "generate_arguments",
           "prune_history"]
