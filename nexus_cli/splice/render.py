"""What a block holds: the compile prefix every block is anchored after, and a tool's canonical text.

Layout of the compile prompt (ChatML, both Nexus models use it):

    COMPILE_PREFIX                      positions 0 .. m0-1   (m0 = the anchor, stored in every block header)
    render_schema(tool)                 positions m0 .. m0+S-1 (the block: S tokens, their K and V rows)
"""

from __future__ import annotations

import json

from ..errors import ModelError
from ..registry import Tool

# Bump when render_schema, COMPILE_PREFIX or the extraction changes: every block's key changes with it.
RENDER_VERSION = "nexus-chatml-tool-v1"
COMPILE_PREFIX = (
    "<|im_start|>system\n"
    "You are a helpful assistant with access to tools. Each tool is described below by a line \"# Tool\" "
    "followed by one JSON object with its name, server, description and parameters (a JSON Schema).\n"
)


def render_schema(tool: Tool) -> str:
    """The canonical text of one tool, as the model sees it after the prefix:

        "# Tool\\n" + compact JSON of {"description", "name", "parameters", "server"} (keys sorted at every
        level, separators "," and ":", non-ASCII kept as UTF-8) + "\\n"

    `parameters` is the tool's MCP inputSchema unchanged (but for key order)."""
    obj = {"name": tool.name, "server": tool.server, "description": tool.description, "parameters": tool.input_schema}
    return "# Tool\n" + json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def prefix_tokens(model) -> list[int]:
    """Tokens of COMPILE_PREFIX for `model` (BOS first when the model adds one). Its length is the anchor m0."""
    if model.identity.chat_template != "chatml":
        raise ModelError(
            f"model {model.name} does not use the ChatML template; the compile prefix and schema rendering are "
            "defined for ChatML models (smollm2-135m, qwen2.5-0.5b)"
        )
    return model.tokenize(COMPILE_PREFIX, add_special=True, parse_special=True)
