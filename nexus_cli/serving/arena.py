"""The L0 exact-token radix arena: a fixed pool of sequence slots in one llama.cpp context, reused by exact-token
longest-common-prefix (LCP) matching (paper §VI-D).

    arena = L0Arena(ctx, n_slots=32)               # ctx: adapters.llama.LlamaContext, n_seq_max >= 1 + n_slots
    acq = arena.acquire(prompt_tokens, min_prefix=n_system)
    ctx.decode(prompt_tokens[acq.n_reused:], acq.n_reused, arena.work_seq)   # only the suffix is decoded
    ... generate more into arena.work_seq ...
    arena.commit(all_tokens_held_by_the_work_sequence)

Layout: sequence `work_seq` (0 by default) is the working sequence of the turn; sequences
`first_slot_seq .. first_slot_seq + n_slots - 1` are the slots. The context must have a unified KV cache
(`kv_unified = true`, as every `LlamaContext` has), so `llama_memory_seq_cp` shares cells between sequences: reusing a
slot's prefix adds the working sequence's id to the slot's cells, and committing the working sequence to a slot adds
the slot's id to the working sequence's cells. Nothing is copied and no KV cell is allocated for a reused prefix; a
prefix shared by many slots (a common system prompt) is stored once. That is the "radix" of the name: the cells form
a prefix tree keyed by tokens, with the slots as its leaves.

Hot path (`acquire`): the query tokens are copied into a preallocated row, compared against the preallocated slot
table [n_slots, capacity] (int32) in one vectorised `np.equal` into a preallocated boolean matrix whose sentinel
column ends every row, and the first mismatch of each row is its LCP. The best slot (longest LCP, most recently used
on ties) is copied into the working sequence with one `llama_memory_seq_rm` + one `llama_memory_seq_cp`; that copy
is what `copy_ns` times. The slot table, LRU clock and counters are fixed-size NumPy arrays allocated once.

Eviction is LRU: `commit` overwrites the slot the turn continued (its tokens are a prefix of the new ones: the same
conversation grew), else an empty slot, else the least recently used one. When llama.cpp has no free cell for a decode,
`decode_with_eviction` evicts LRU slots one at a time and retries.

Not thread-safe: a caller that shares an arena between threads serializes the whole turn (serving/session.py holds
one re-entrant lock around it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ModelError, UsageError

DEFAULT_SLOTS = 32


@dataclass
class Acquired:
    """What `acquire` did: the slot reused (-1 when none), how many prompt tokens are already in the working sequence
    (decode from there), whether it counted as a hit, and how long the KV copy took (ns)."""

    slot: int
    n_reused: int
    lcp: int
    hit: bool
    copy_ns: int
    lookup_ns: int


class L0Arena:
    """A fixed pool of `n_slots` warm sequences over one LlamaContext (see the module doc)."""

    def __init__(self, ctx, n_slots: int = DEFAULT_SLOTS, work_seq: int = 0, first_slot_seq: int = 1,
                 capacity: int | None = None):
        if n_slots < 1:
            raise UsageError("the L0 arena needs at least one slot")
        if not (0 <= work_seq < ctx.n_seq_max):
            raise ModelError(f"work sequence {work_seq} out of range (n_seq_max = {ctx.n_seq_max})")
        last = first_slot_seq + n_slots - 1
        if first_slot_seq < 0 or last >= ctx.n_seq_max or first_slot_seq <= work_seq <= last:
            raise ModelError(f"the L0 arena needs sequence ids {first_slot_seq}..{last} besides the work sequence "
                             f"{work_seq}, below n_seq_max = {ctx.n_seq_max}",
                             hint=f"create the context with n_seq_max >= {max(last, work_seq) + 1}")
        self.ctx = ctx
        self.n_slots = int(n_slots)
        self.work_seq = int(work_seq)
        self.first_slot_seq = int(first_slot_seq)
        self.capacity = int(capacity or ctx.n_ctx)
        # preallocated structures: slot table, lengths, LRU clock, the comparison buffer (+1 sentinel column)
        self._tokens = np.zeros((self.n_slots, self.capacity), dtype=np.int32)
        self._lengths = np.zeros(self.n_slots, dtype=np.int64)
        self._last_used = np.zeros(self.n_slots, dtype=np.int64)
        self._query = np.zeros(self.capacity, dtype=np.int32)
        self._eq = np.zeros((self.n_slots, self.capacity + 1), dtype=np.bool_)
        self._lcp = np.zeros(self.n_slots, dtype=np.int64)
        self._clock = 0
        self._work_from = -1  # the slot the working sequence was last filled from
        self.reset_counters()

    # ------------------------------------------------------------------------------------------------ counters
    def reset_counters(self) -> None:
        self.lookups = 0
        self.hits = 0
        self.misses = 0
        self.copied_tokens = 0
        self.evictions = 0
        self.commits = 0

    def stats(self) -> dict:
        return {
            "slots": self.n_slots,
            "occupied": int(np.count_nonzero(self._lengths)),
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": (self.hits / self.lookups) if self.lookups else None,
            "copied_tokens": self.copied_tokens,
            "evictions": self.evictions,
            "commits": self.commits,
        }

    # ------------------------------------------------------------------------------------------------ slots
    def slot_seq(self, slot: int) -> int:
        return self.first_slot_seq + int(slot)

    def slot_tokens(self, slot: int) -> np.ndarray:
        """A read-only view of the tokens a slot holds."""
        v = self._tokens[slot, : int(self._lengths[slot])]
        v.flags.writeable = False
        return v

    def slot_length(self, slot: int) -> int:
        return int(self._lengths[slot])

    def occupied(self) -> list[int]:
        return [int(s) for s in np.flatnonzero(self._lengths)]

    def clear(self) -> None:
        """Empty every slot and the working sequence (their KV cells are released) and zero the counters."""
        for s in range(self.n_slots):
            self.ctx.seq_rm(self.slot_seq(s), -1, -1)
        self.ctx.seq_rm(self.work_seq, -1, -1)
        self._lengths[:] = 0
        self._last_used[:] = 0
        self._clock = 0
        self._work_from = -1
        self.reset_counters()

    def evict(self, slot: int) -> None:
        if self._lengths[slot]:
            self.ctx.seq_rm(self.slot_seq(slot), -1, -1)
            self._lengths[slot] = 0
            self._last_used[slot] = 0
            self.evictions += 1

    def lru_slot(self, exclude: int = -1) -> int:
        """The least recently used occupied slot (never `exclude`), -1 when none."""
        best, best_t = -1, None
        for s in np.flatnonzero(self._lengths):
            s = int(s)
            if s == exclude:
                continue
            t = int(self._last_used[s])
            if best_t is None or t < best_t:
                best, best_t = s, t
        return best

    # ------------------------------------------------------------------------------------------------ lookup
    def match(self, tokens: Sequence[int] | np.ndarray) -> tuple[int, int]:
        """(slot, LCP) of the slot sharing the longest exact token prefix with `tokens` (ties: most recently used);
        (-1, 0) when no slot shares a token."""
        n = len(tokens)
        if n == 0:
            return -1, 0
        n = min(n, self.capacity)
        q = self._query
        q[:n] = tokens[:n]
        eq = self._eq
        np.equal(self._tokens[:, :n], q[:n], out=eq[:, :n])
        eq[:, n] = False  # sentinel: the first False of each row is its LCP
        np.argmin(eq[:, : n + 1], axis=1, out=self._lcp)
        np.minimum(self._lcp, self._lengths, out=self._lcp)
        best = int(self._lcp.max())
        if best <= 0:
            return -1, 0
        cands = np.flatnonzero(self._lcp == best)
        slot = int(cands[np.argmax(self._last_used[cands])]) if len(cands) > 1 else int(cands[0])
        return slot, best

    def acquire(self, tokens: Sequence[int] | np.ndarray, min_prefix: int = 1, owner: str | None = None) -> Acquired:
        """Prepare the working sequence for a prompt: empty it, then (on a hit) copy the best slot's first
        n_reused cells into it. A hit is an LCP of at least `min_prefix` tokens. n_reused never covers the last
        prompt token, so the caller always decodes at least one token and gets fresh logits. `owner` is accepted for
        interface parity with StateArena and ignored: every slot is shared."""
        t0 = time.perf_counter_ns()
        slot, lcp = self.match(tokens)
        t1 = time.perf_counter_ns()
        self.lookups += 1
        ctx = self.ctx
        ctx.seq_rm(self.work_seq, -1, -1)
        n_reused = min(lcp, len(tokens) - 1)
        copy_ns = 0
        hit = slot >= 0 and lcp >= max(1, int(min_prefix)) and n_reused > 0
        if hit:
            c0 = time.perf_counter_ns()
            ctx.seq_cp(self.slot_seq(slot), self.work_seq, 0, n_reused)
            copy_ns = time.perf_counter_ns() - c0
            self.hits += 1
            self.copied_tokens += n_reused
            self._clock += 1
            self._last_used[slot] = self._clock
            self._work_from = slot
        else:
            self.misses += 1
            n_reused = 0
            self._work_from = -1
        return Acquired(slot=slot if hit else -1, n_reused=n_reused, lcp=lcp, hit=hit, copy_ns=copy_ns,
                        lookup_ns=t1 - t0)

    # ------------------------------------------------------------------------------------------------ commit
    def commit(self, tokens: Sequence[int] | np.ndarray, owner: str | None = None) -> int:
        """Keep what the working sequence holds (`tokens`, positions 0..len-1) in a slot; returns the slot.

        The slot is the one the turn continued when its tokens are a prefix of `tokens` (the conversation grew),
        else an empty slot, else the least recently used one (evicted). The working sequence keeps its cells."""
        n = len(tokens)
        if n == 0:
            raise UsageError("nothing to commit: the token list is empty")
        held = self.ctx.seq_pos_max(self.work_seq) + 1
        if held != n:
            raise ModelError(f"the working sequence holds {held} positions, not the {n} tokens being committed")
        n_keep = min(n, self.capacity)
        target = -1
        src = self._work_from
        if src >= 0 and self._lengths[src]:
            ls = int(self._lengths[src])
            if ls <= n_keep and np.array_equal(self._tokens[src, :ls], np.asarray(tokens[:ls], dtype=np.int32)):
                target = src
        if target < 0:
            empty = np.flatnonzero(self._lengths == 0)
            if len(empty):
                target = int(empty[0])
            else:
                target = self.lru_slot()
                self.evict(target)
        seq = self.slot_seq(target)
        self.ctx.seq_rm(seq, -1, -1)
        self.ctx.seq_cp(self.work_seq, seq, 0, n_keep)
        self._tokens[target, :n_keep] = tokens[:n_keep]
        self._lengths[target] = n_keep
        self._clock += 1
        self._last_used[target] = self._clock
        self._work_from = target
        self.commits += 1
        return target

    def adopt(self, slot: int, tokens: Sequence[int]) -> None:
        """Record that sequence slot_seq(slot) already holds `tokens` (e.g. restored from a saved state)."""
        n = len(tokens)
        if n > self.capacity:
            raise UsageError(f"{n} tokens exceed the arena's slot capacity {self.capacity}")
        held = self.ctx.seq_pos_max(self.slot_seq(slot)) + 1
        if held != n:
            raise ModelError(f"slot {slot} holds {held} positions, not the {n} tokens adopted")
        self._tokens[slot, :n] = tokens
        self._lengths[slot] = n
        self._clock += 1
        self._last_used[slot] = self._clock

    def free_slot(self) -> int:
        """An empty slot, evicting the least recently used one when all are occupied."""
        empty = np.flatnonzero(self._lengths == 0)
        if len(empty):
            return int(empty[0])
        s = self.lru_slot()
        self.evict(s)
        return s

    # ------------------------------------------------------------------------------------------------ decode
    def decode_with_eviction(self, tokens: Sequence[int], start_pos: int) -> None:
        """Decode into the working sequence; when llama.cpp finds no free KV cell, evict the least recently used slot
        (never the one the working sequence came from) and retry, until no slot is left to evict."""
        while True:
            try:
                self.ctx.decode(tokens, start_pos, self.work_seq)
                return
            except ModelError as e:
                if "no KV slot" not in e.message:
                    raise
                victim = self.lru_slot(exclude=self._work_from)
                if victim < 0:
                    raise
                self.evict(victim)
                # a failed multi-chunk decode may have placed its first chunks: drop them before retrying
                self.ctx.seq_rm(self.work_seq, start_pos, -1)

    # ------------------------------------------------------------------------------------------------ persistence
    def export_state(self, tokens: Sequence[int], owner: str | None = None) -> bytes | None:
        """The llama.cpp state of the slot holding exactly `tokens`, or None when no slot does."""
        slot, lcp = self.match(tokens)
        if slot < 0 or lcp != len(tokens) or self.slot_length(slot) != len(tokens):
            return None
        return self.ctx.state_seq_get(self.slot_seq(slot))

    def import_state(self, tokens: Sequence[int], blob: bytes, owner: str | None = None) -> int:
        """Restore a saved state (of `tokens`) into a free slot (evicting the LRU one if needed); returns the slot."""
        slot = self.free_slot()
        seq = self.slot_seq(slot)
        try:
            self.ctx.state_seq_set(blob, seq)
            self.adopt(slot, tokens)
        except Exception:
            self.ctx.seq_rm(seq, -1, -1)
            raise
        return slot


class StateArena:
    """The deterministic variant: each conversation (an `owner` key) keeps its own last state in host memory, and
    every `acquire` rebuilds the KV cache from empty with only that state.

    Why: llama.cpp's CPU kernels are not batch-invariant in general (the same prompt decoded as one batch, or as a
    prefix plus a suffix, can differ by float rounding, up to ~0.9 in a logit on SmolLM2 at some split sizes), and the
    attention accumulates in cell order, so where a prompt's cells sit matters too. In a shared arena the reused
    prefix length and the cell placement depend on what other conversations did before, so the same turn can give
    different tokens depending on how turns from several threads interleaved. Here a conversation reuses only its own
    previous state: `acquire` empties the cache (the head returns to cell 0), restores the owner's state (cells
    0..L-1, in position order), drops the tail beyond the LCP, and the rest of the prompt and the generated tokens
    continue at L, L+1, ... The sequence of llama.cpp calls that produces a turn is then a function of that
    conversation alone: bit-identical outputs whatever ran before or in between. A call without an owner (a stateless
    request) always prefills cold. The price: no sharing across conversations, and one copy of the reused prefix's
    K/V rows (host -> cache) per turn. Owners beyond `n_slots` are evicted LRU (their next turn prefills cold)."""

    def __init__(self, ctx, n_slots: int = DEFAULT_SLOTS, work_seq: int = 0):
        from collections import OrderedDict

        if n_slots < 1:
            raise UsageError("the L0 arena needs at least one slot")
        if not (0 <= work_seq < ctx.n_seq_max):
            raise ModelError(f"work sequence {work_seq} out of range (n_seq_max = {ctx.n_seq_max})")
        self.ctx = ctx
        self.n_slots = int(n_slots)
        self.work_seq = int(work_seq)
        self._slots: "OrderedDict[str, tuple[list[int], bytes]]" = OrderedDict()
        self._owner: str | None = None
        self.reset_counters()

    reset_counters = L0Arena.reset_counters

    def stats(self) -> dict:
        return {
            "slots": self.n_slots,
            "occupied": len(self._slots),
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": (self.hits / self.lookups) if self.lookups else None,
            "copied_tokens": self.copied_tokens,
            "evictions": self.evictions,
            "commits": self.commits,
            "host_bytes": sum(len(b) for _, b in self._slots.values()),
        }

    def occupied(self) -> list[str]:
        return list(self._slots)

    def clear(self) -> None:
        self.ctx.clear()
        self._slots.clear()
        self._owner = None
        self.reset_counters()

    @staticmethod
    def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
        n = min(len(a), len(b))
        x = np.asarray(a[:n], dtype=np.int64)
        y = np.asarray(b[:n], dtype=np.int64)
        neq = np.flatnonzero(x != y)
        return int(neq[0]) if len(neq) else n

    def acquire(self, tokens: Sequence[int], min_prefix: int = 1, owner: str | None = None) -> Acquired:
        t0 = time.perf_counter_ns()
        entry = self._slots.get(owner) if owner is not None else None
        lcp = self._lcp(entry[0], tokens) if entry else 0
        t1 = time.perf_counter_ns()
        self.lookups += 1
        ctx = self.ctx
        ctx.clear()
        self._owner = owner
        n_reused = min(lcp, len(tokens) - 1)
        hit = entry is not None and lcp >= max(1, int(min_prefix)) and n_reused > 0
        copy_ns = 0
        if hit:
            c0 = time.perf_counter_ns()
            ctx.state_seq_set(entry[1], self.work_seq)
            ctx.seq_rm(self.work_seq, n_reused, -1)
            copy_ns = time.perf_counter_ns() - c0
            self.hits += 1
            self.copied_tokens += n_reused
            self._slots.move_to_end(owner)
        else:
            self.misses += 1
            n_reused = 0
        return Acquired(slot=0 if hit else -1, n_reused=n_reused, lcp=lcp, hit=hit, copy_ns=copy_ns,
                        lookup_ns=t1 - t0)

    def _store(self, owner: str, tokens: list[int], blob: bytes) -> None:
        if owner not in self._slots and len(self._slots) >= self.n_slots:
            self._slots.popitem(last=False)
            self.evictions += 1
        self._slots[owner] = (tokens, blob)
        self._slots.move_to_end(owner)

    def commit(self, tokens: Sequence[int], owner: str | None = None) -> int:
        """Keep the working sequence's state as `owner`'s (default: the owner of the last acquire). Without an owner
        nothing is kept. Returns 0 when kept, -1 when not."""
        n = len(tokens)
        if n == 0:
            raise UsageError("nothing to commit: the token list is empty")
        held = self.ctx.seq_pos_max(self.work_seq) + 1
        if held != n:
            raise ModelError(f"the working sequence holds {held} positions, not the {n} tokens being committed")
        owner = owner if owner is not None else self._owner
        if owner is None:
            return -1
        self._store(owner, [int(t) for t in tokens], self.ctx.state_seq_get(self.work_seq))
        self.commits += 1
        return 0

    def decode_with_eviction(self, tokens: Sequence[int], start_pos: int) -> None:
        self.ctx.decode(tokens, start_pos, self.work_seq)  # only one sequence is ever in the cache

    def export_state(self, tokens: Sequence[int], owner: str | None = None) -> bytes | None:
        entry = self._slots.get(owner if owner is not None else self._owner)
        if entry is None or entry[0] != [int(t) for t in tokens]:
            return None
        return entry[1]

    def import_state(self, tokens: Sequence[int], blob: bytes, owner: str | None = None) -> int:
        """Check a saved state in the cache (llama.cpp validates it), then keep it as `owner`'s."""
        ctx = self.ctx
        ctx.clear()
        try:
            ctx.state_seq_set(blob, self.work_seq)
            held = ctx.seq_pos_max(self.work_seq) + 1
            if held != len(tokens):
                raise ModelError(f"the state holds {held} positions, not the {len(tokens)} tokens recorded")
        finally:
            ctx.clear()
        if owner is not None:
            self._store(owner, [int(t) for t in tokens], bytes(blob))
        return 0
