"""Serving: multi-turn sessions on one shared engine, and the MCP server and client."""
