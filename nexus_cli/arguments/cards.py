"""Compiled tool cards: the argument prompt's tool block, compiled once per model and tool into a KV block (`.atb`,
docs/atb-format.md) and spliced after the live conversation instead of being decoded again every turn.

The argument prompt (arguments/prompt.py) splits into three runs of its own token ids:

    [system + user header][conversation window][tool block][request + assistant header]
     the anchor: m0 tokens  grows every turn    the card    decoded every call

A card is compiled after the anchor, which is the prompt's head when there is no window. So:
  - without a window the card lands on its compile positions (delta 0): its cells are what decoding the same tokens
    at the same positions gives (flash attention: independent of how a prompt is split into batches), nothing is
    recomputed, and the arguments are those of a full prefill;
  - with a window it lands at n_past = the head's length, every K row re-rotated by n_past - m0 (splice/engine.py);
    its first k = ceil(S * H / 100) tokens are decoded after the conversation instead (the repair), and only the rest
    is spliced. H comes from the model's calibrated CardRepair at that depth.
The card is the prompt's own token ids, those wholly inside the tool block's text: a token that spans an edge is
decoded with its neighbours, so the card's tokens are the same in every call of the tool.

Cards live in a cache folder, one file per (model, V layout, llama.cpp version, anchor, card tokens), named by a
SHA-256 over all of them, so a changed tool or another model looks for another file. A file that is there but
fails its checksums, was compiled for another model, or holds other tokens is refused, removed and compiled again;
it is never spliced.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..atb import write_block
from ..errors import FormatError, ModelError, NexusError
from ..splice.compile import block_header_for, extract_cells
from ..splice.engine import SpliceEngine, check_block, open_checked_block, recompute_tokens

CARD_VERSION = "nexus-card-v1"  # bump when the anchor, the card's text or the extraction changes
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024  # ~400 cards of Qwen2.5-0.5B (12 KB of K/V per token, ~200 tokens a card)
REQUEST_MARK = "\n\nRequest: "  # what follows the tool block in the user turn (prompt.build_messages)
CARD_REPAIR_FILE = Path(__file__).with_name("card_repair.json")  # the calibrated repair per model (CardRepair)
# A model nobody calibrated decodes the card after a conversation in full: a share below 100 % is used only where a
# calibration showed its KL within 2x the floor (none has so far: Qwen2.5-0.5B and SmolLM2 both chose 100 %)
DEFAULT_HEAD_PCT = 100.0


@dataclass(frozen=True)
class CardSpan:
    """Where the card sits in one prompt: tokens[:head] come before it, tokens[head:head + len(tokens)] are it."""

    head: int
    tokens: tuple[int, ...]
    anchor: tuple[int, ...]  # the prompt's head without a window: what the card is compiled after

    @property
    def end(self) -> int:
        return self.head + len(self.tokens)


def card_span(model: Any, messages: Sequence[dict], block: str, tokens: Sequence[int]) -> CardSpan | None:
    """The card's place in the prompt `tokens` (model.chat_tokens(messages)): the prompt's own tokens that lie wholly
    inside the tool block's text. A token that spans an edge (")\n\n" in Qwen's vocabulary) stays with what is
    decoded, so the card's tokens are the same in every call of the tool whatever the window and the request. The
    anchor is the prompt's tokens wholly inside the system turn and the user turn's header. None when the prompt's
    pieces do not spell the rendered text (then the prompt is prefilled as a whole)."""
    rendered = model.apply_chat_template(messages)
    user = messages[-1]["content"]
    at = rendered.rfind(user)
    block_end = user.rfind(REQUEST_MARK)
    block_start = block_end - len(block)
    if at < 0 or block_start < 0 or user[block_start:block_end] != block:
        return None
    text = rendered.encode("utf-8")
    pieces = [model.token_to_piece(t) for t in tokens]
    spelled = b"".join(pieces)
    if not spelled.endswith(text):
        return None
    shift = len(spelled) - len(text)  # a BOS the template text does not show
    ends = np.cumsum([len(p) for p in pieces]) - shift
    starts = ends - np.array([len(p) for p in pieces])
    b_anchor = len(rendered[:at].encode("utf-8"))
    b_start = len(rendered[:at + block_start].encode("utf-8"))
    b_end = len(rendered[:at + block_end].encode("utf-8"))
    n_anchor = int(np.searchsorted(ends, b_anchor, side="right"))  # tokens ending at or before the user's text
    head = int(np.searchsorted(starts, b_start, side="left"))  # the first token starting inside the block
    end = int(np.searchsorted(ends, b_end, side="right"))  # one past the last token ending inside it
    if end - head < 1 or head < n_anchor:
        return None
    return CardSpan(head, tuple(int(t) for t in tokens[head:end]), tuple(int(t) for t in tokens[:n_anchor]))


def card_key(ctx: Any, span: CardSpan) -> str:
    """SHA-256 over everything a card's bytes depend on."""
    try:
        from llama_cpp import __version__ as llama_version
    except ImportError:  # pragma: no cover - the adapter could not have loaded either
        llama_version = "?"
    parts = [CARD_VERSION, ctx.model.identity.sha256, llama_version, f"v_layout={ctx.v_layout}",
             ",".join(map(str, span.anchor)), ",".join(map(str, span.tokens))]
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()


class CardStore:
    """Compiled cards on disk: `<root>/<model fingerprint>/<card_key>.atb`, written atomically (the block writer's
    temporary file + rename), the folder capped at `max_bytes` (oldest files first), the last `memory_items` blocks
    kept open (memory-mapped)."""

    def __init__(self, root: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES, memory_items: int = 64):
        self.root = Path(root).expanduser()
        self.max_bytes = int(max_bytes)
        self.memory_items = int(memory_items)
        self._open: "OrderedDict[str, Any]" = OrderedDict()
        self.compiled = self.loaded = self.memory_hits = self.refused = 0
        self.last_refusal: str | None = None

    @classmethod
    def default(cls) -> "CardStore | None":
        """$NEXUS_CARD_CACHE (a folder; "off" disables card splicing), else ~/.cache/nexus/cards."""
        env = os.environ.get("NEXUS_CARD_CACHE", "")
        if env.strip().lower() in ("off", "0", "none", "false"):
            return None
        return cls(Path(env) if env.strip() else Path.home() / ".cache" / "nexus" / "cards")

    def path_for(self, ctx: Any, key: str) -> Path:
        return self.root / ctx.model.identity.fingerprint / f"{key}.atb"

    def _remember(self, key: str, block: Any) -> None:
        self._open[key] = block
        self._open.move_to_end(key)
        while len(self._open) > self.memory_items:
            _, old = self._open.popitem(last=False)
            old.close()

    def _accept(self, ctx: Any, span: CardSpan, path: Path):
        """The block in `path` if it is this card for this model; FormatError / ModelError naming why not."""
        block = open_checked_block(path)  # format and checksums
        try:
            check_block(block.header, ctx.identity, ctx.v_layout, f"card {path.name}")
            if int(block.header.anchor_pos) != len(span.anchor):
                raise FormatError(f"card {path.name} is anchored at {block.header.anchor_pos}, "
                                  f"not {len(span.anchor)}")
            if tuple(int(t) for t in block.tokens) != span.tokens:
                raise FormatError(f"card {path.name} holds other tokens than the tool's card")
        except NexusError:
            block.close()
            raise
        return block

    def block_for(self, ctx: Any, span: CardSpan, seq_id: int) -> tuple[Any, str]:
        """(the compiled block of this card, how it was found: "memory", "disk" or "compiled"). A file that is
        refused is removed and compiled again on `seq_id`, a sequence the caller lends empty and gets back empty."""
        key = card_key(ctx, span)
        block = self._open.get(key)
        if block is not None:
            self._open.move_to_end(key)
            self.memory_hits += 1
            return block, "memory"
        path = self.path_for(ctx, key)
        if path.is_file():
            try:
                block = self._accept(ctx, span, path)
            except (FormatError, ModelError) as e:
                self.refused += 1
                self.last_refusal = e.message
                try:
                    path.unlink()
                except OSError:
                    pass
            else:
                self.loaded += 1
                self._remember(key, block)
                return block, "disk"
        block = self._compile(ctx, span, seq_id, path)
        self.compiled += 1
        self._remember(key, block)
        return block, "compiled"

    def _compile(self, ctx: Any, span: CardSpan, seq_id: int, path: Path):
        m0, n = len(span.anchor), len(span.tokens)
        ctx.seq_rm(seq_id, -1, -1)
        try:
            ctx.decode(list(span.anchor) + list(span.tokens), 0, seq_id, logits_last=False)
            k, v = extract_cells(ctx, seq_id, m0, m0 + n)
        finally:
            ctx.seq_rm(seq_id, -1, -1)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_block(path, block_header_for(ctx.identity, m0, n, ctx.v_layout), np.asarray(span.tokens, np.int32), k, v)
        self._evict(keep=path)
        return self._accept(ctx, span, path)

    def _evict(self, keep: Path) -> None:
        try:
            files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.root.glob("*/*.atb")]
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files, key=lambda f: f[0]):
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            try:
                p.unlink()
                total -= size
            except OSError:
                pass


@dataclass(frozen=True)
class CardRepair:
    """The share of a card's first tokens decoded after the conversation instead of spliced, by the card's depth
    (n_past): `bands` is ((depth up to, percent), ...) in increasing depth, the last band open-ended (None).
    Decoded, those tokens attend to the conversation, and the rest of the card attends to them, which is what a
    block compiled without the conversation lacks most (EPIC's observation; measured in docs/splice.md)."""

    bands: tuple[tuple[int | None, float], ...]
    source: str = "default"

    def head_pct(self, depth: int) -> float:
        for upto, pct in self.bands:
            if upto is None or depth <= upto:
                return float(pct)
        return 100.0

    @classmethod
    def for_model(cls, sha256: str) -> "CardRepair":
        """The calibrated repair of a model (CARD_REPAIR_FILE, written by `nexus bench card-splice --calibrate`),
        else DEFAULT_HEAD_PCT at every depth."""
        table = _repair_table()
        entry = table.get("models", {}).get(sha256)
        if not entry:
            return cls(((None, DEFAULT_HEAD_PCT),))
        return cls(tuple((b[0], float(b[1])) for b in entry["bands"]), source=str(entry.get("source", "")))


def _repair_table() -> dict:
    try:
        return json.loads(CARD_REPAIR_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


class CardSplicer:
    """Places a tool's compiled card into the working sequence of an argument call (the PromptCache step before
    decoding): the head the sequence does not hold yet is decoded, the card spliced after it, and the call decodes
    the repair and the request. One per LlamaContext user; `scratch_seq` is lent to the splice and the compile."""

    def __init__(self, ctx: Any, store: CardStore, work_seq: int, scratch_seq: int,
                 repair: CardRepair | None = None):
        self.ctx = ctx
        self.store = store
        self.work_seq = work_seq
        self.scratch_seq = scratch_seq
        self.repair = repair or CardRepair.for_model(ctx.model.identity.sha256)
        self.engine = SpliceEngine(ctx, live_seq=work_seq, scratch_seq=scratch_seq)
        self.spliced = 0

    def head_tokens(self, span: CardSpan, head_pct: float | None = None) -> int:
        """How many of the card's first tokens are decoded after the conversation: none where the card follows the
        anchor (it lands where it was compiled, after the same tokens), else the repair's share at its depth (or
        `head_pct`, a share given by the caller)."""
        if span.head == len(span.anchor):
            return 0
        pct = self.repair.head_pct(span.head) if head_pct is None else float(head_pct)
        return recompute_tokens(len(span.tokens), pct)

    def prepare(self, tokens: Sequence[int], span: CardSpan, n_held: int,
                head_pct: float | None = None) -> tuple[int, dict]:
        """Make the working sequence, which holds tokens[:n_held], hold the prompt up to its card's end minus the
        repair. Returns (the position decoding starts from, a report for the turn)."""
        ctx, seq = self.ctx, self.work_seq
        if n_held >= span.end:
            return n_held, {"status": "reused", "tokens": len(span.tokens)}  # the slot already holds this card
        k = self.head_tokens(span, head_pct)
        if k >= len(span.tokens):  # the repair decodes the whole card at this depth: nothing to splice
            return n_held, {"status": "decoded", "tokens": len(span.tokens), "n_past": span.head}
        try:
            block, found = self.store.block_for(ctx, span, self.scratch_seq)
        except ModelError:
            raise  # the context itself (full, refused): the caller's business
        except (OSError, NexusError) as e:  # a cache that cannot be written: the card is decoded, the turn goes on
            why = e.message if isinstance(e, NexusError) else f"card cache {self.store.root}: {e.strerror or e}"
            return n_held, {"status": "decoded", "tokens": len(span.tokens), "n_past": span.head, "reason": why}
        if n_held > span.head:
            ctx.seq_rm(seq, span.head, -1)
            n_held = span.head
        if n_held < span.head + k:
            ctx.decode(list(tokens[n_held:span.head + k]), n_held, seq, logits_last=False)
        placed = self.engine.place(block, span.head, 0.0, head=k)
        self.spliced += 1
        return span.end, {"status": "spliced", "card": found, "tokens": placed.n_tokens, "n_past": placed.n_past,
                          "recomputed": k, "spliced": placed.n_tokens - k,
                          "overhead_ms": round(placed.overhead_ms, 3)}
