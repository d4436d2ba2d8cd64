"""A tiny MCP stdio server for tests (MCP Python SDK): two tools with typed, partly optional arguments.

Run: python tests/data/mcp_tiny_server.py   (speaks MCP over stdin/stdout)
"""

from typing import Literal

from mcp.server.mcpserver import MCPServer

server = MCPServer("nexus-tiny")


@server.tool(description="Create a GitHub repository for the authenticated user.")
def create_repository(name: str, private: bool = False, description: str | None = None) -> str:
    return f"created {name}"


@server.tool(description="List issues of a repository.")
def list_issues(owner: str, repo: str, state: Literal["open", "closed", "all"] = "open", per_page: int = 30) -> str:
    return f"{owner}/{repo}: no issues ({state})"


if __name__ == "__main__":
    server.run("stdio")
