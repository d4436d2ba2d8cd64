"""Routing: the index a registry is built into, and the router that reads it."""
