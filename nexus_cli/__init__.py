"""Nexus: retrieval-decoupled tool routing and KV-cache splicing for local agentic LLMs."""

__version__ = "0.1.0"
