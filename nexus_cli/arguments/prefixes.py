"""Each tool's shared prompt prefix kept as a KV state, so a call decodes only what is its own."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from ..prefix_store import PrefixStore


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two token lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tool_prefix_tokens(model: Any, messages: Sequence[dict], block: str, tokens: Sequence[int]) -> int:
    """How many of the prompt's `tokens` every call of this tool shares, so that ArgumentPrefixes can keep them: the
    chat template up to the end of the tool's block when the last user turn starts with it (no history window), else
    up to the start of that turn (the system prompt, shared by every tool). Found as the common prefix of the prompt
    and that text tokenized alone, so a token that spans the boundary (`)` and the newlines after it) is left to the
    rest."""
    rendered = model.apply_chat_template(messages)
    user = messages[-1]["content"]
    at = rendered.rfind(user)
    if at < 0:
        return 0
    end = at + len(block) if user.startswith(block) else at
    head = model.tokenize(rendered[:end], add_special=True, parse_special=True)
    return common_prefix(head, tokens)


class ArgumentPrefixes:
    """The prompt prefix a call shares with every call of its tool (tool_prefix_tokens: the system prompt and, for a
    call without history, the tool's block) kept as a llama.cpp sequence state: the last `memory_items` in memory
    and, with a `PrefixStore`, on disk, so that a call decodes only the rest. A restored state is a byte copy of a
    decode of the same tokens at the same positions, so the answer is the one decoding them gives. One object per
    LlamaContext user (the Router keeps one); states are keyed by the model, the V-cache layout and the prefix's
    token ids."""

    SUBDIR = "arguments"  # below the prefix store's directory (PrefixStore.default(SUBDIR))

    def __init__(self, store: Any = None, memory_items: int = 16):
        self.store = store
        self.memory_items = int(memory_items)
        self._memory: "OrderedDict[str, bytes]" = OrderedDict()  # key -> state, least recently used first
        self.memory_hits = self.disk_hits = self.decoded = 0

    def _remember(self, key: str, blob: bytes) -> None:
        self._memory[key] = blob
        self._memory.move_to_end(key)
        while len(self._memory) > self.memory_items:
            self._memory.popitem(last=False)

    def prepare(self, ctx: Any, tokens: Sequence[int], n_prefix: int, seq_id: int = 0, warm: int = 0) -> int:
        """Make `seq_id` hold tokens[:n_prefix] at positions 0.. (restored, or decoded from position `warm`, which the
        sequence already holds, and then kept). Returns n_prefix, the position generation starts from."""
        key = PrefixStore.key(ctx, "arguments\x00" + ",".join(map(str, tokens[:n_prefix])))
        blob, from_disk = self._memory.get(key), False
        if blob is None and self.store is not None:
            stored = self.store.get(key)
            blob, from_disk = (stored[0] if stored is not None else None), True
        if blob is not None:
            if ctx.try_state_seq_set(blob, seq_id) and ctx.seq_pos_max(seq_id) == n_prefix - 1:
                if from_disk:
                    self.disk_hits += 1
                else:
                    self.memory_hits += 1
                self._remember(key, blob)
                return n_prefix
            self._memory.pop(key, None)  # refused: decoded again below
            if self.store is not None:
                self.store.discard(key)
            warm = 0  # the attempt emptied the sequence
        start = min(warm, n_prefix)
        ctx.seq_rm(seq_id, start, -1)
        if start < n_prefix:
            ctx.decode(tokens[start:n_prefix], start, seq_id)
        blob = ctx.state_seq_get(seq_id)
        self.decoded += 1
        self._remember(key, blob)
        if self.store is not None:
            self.store.put(key, (blob, np.zeros(0, dtype=np.float16), n_prefix))
        return n_prefix
