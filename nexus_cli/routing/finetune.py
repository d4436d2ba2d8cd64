"""Fine-tuning the router embedder (`nexus index --finetune`): a bi-encoder taught to meet each request with its tool.

The requests are the tools' example requests when there are any (`--examples`), else requests derived from the
registry itself (text.training_queries, seeded); never evaluation data. Hard negatives are the tools the model being
trained still confuses. The fine-tuned folder carries a record of how it was trained (FINETUNE_RECORD).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import textgen
from ..adapters.embedder import Embedder, finetune_biencoder
from ..config import (
    FINETUNE_BUDGET_S,
    FINETUNE_EPOCHS,
    FINETUNE_EXAMPLE_POSITIVES,
    FINETUNE_ROUNDS,
    FINETUNE_SECOND_ROUND_EPOCHS,
)
from ..errors import NexusError
from ..files import atomic_write_json

# Written into a fine-tuned embedder's folder: how it was trained (finetune_embedder's record).
FINETUNE_RECORD = "nexus-finetune.json"

TRAIN_SEED = 7  # differs from the gate calibration seed, so the gate's probes are not the training queries


def finetune_record(model_dir) -> dict | None:
    """The record finetune_embedder left in a model folder, or None (a stock model, an unreadable record)."""
    if not model_dir:
        return None
    try:
        rec = json.loads((Path(model_dir) / FINETUNE_RECORD).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def finetune_embedder(tools, embedder, out_dir: Path, n_queries: int = 4, epochs: int = FINETUNE_EPOCHS,
                      batch_size: int = 32, lr: float = 3e-5, time_budget_s: float = FINETUNE_BUDGET_S,
                      progress=None, seed: int = TRAIN_SEED, examples: Sequence[Sequence[str]] | None = None,
                      precision: str = "auto", n_hard: int = 1,
                      example_positives: bool = FINETUNE_EXAMPLE_POSITIVES, rounds: int = FINETUNE_ROUNDS,
                      second_round_epochs: int = FINETUNE_SECOND_ROUND_EPOCHS, device: str = "cpu") -> dict:
    """Fine-tune the bi-encoder (`_finetune_round`), then, on example requests and with `rounds` = 2, once more
    from the model the first round made, its hard negatives mined by that model: the tools it still confuses, where
    the first round's came from the base model's confusions, most of which it has learned to separate. Saves the
    final model to out_dir with a record of both rounds (FINETUNE_RECORD)."""
    if rounds not in (1, 2):
        raise NexusError(f"fine-tuning rounds must be 1 or 2, got {rounds}")
    t0 = time.perf_counter()
    common = dict(n_queries=n_queries, batch_size=batch_size, lr=lr, seed=seed, examples=examples,
                  precision=precision, n_hard=n_hard, example_positives=example_positives, device=device)
    info = _finetune_round(tools, embedder, out_dir, epochs=epochs, time_budget_s=time_budget_s,
                           progress=progress, label="fine-tuning embedder", **common)
    info["rounds"] = 1
    left = time_budget_s - (time.perf_counter() - t0)
    if rounds == 2 and examples is not None:  # measured on example requests only (docs/routing.md)
        if left <= 0:
            info["second_round"] = {"skipped": f"the time budget of {time_budget_s:.0f} s was spent by the first round"}
        else:
            out_dir = Path(out_dir)
            second_dir = out_dir.with_name(out_dir.name + ".round2")
            shutil.rmtree(second_dir, ignore_errors=True)
            try:
                second = _finetune_round(tools, Embedder(str(out_dir), device=device), second_dir,
                                         epochs=second_round_epochs,
                                         time_budget_s=left, progress=progress,
                                         label="fine-tuning embedder (round 2)", **common)
                shutil.rmtree(out_dir)
                second_dir.rename(out_dir)
            except BaseException:
                shutil.rmtree(second_dir, ignore_errors=True)
                raise
            second["base"] = "the first round's model"
            info.update(rounds=2, second_round=second)
    # the record travels with the model folder, so an index built later with `--embedder THAT_FOLDER` knows it too
    atomic_write_json(Path(out_dir) / FINETUNE_RECORD, info)
    return info


def _finetune_round(tools, embedder, out_dir: Path, n_queries: int, epochs: int, batch_size: int, lr: float,
                    time_budget_s: float, progress, seed: int, examples: Sequence[Sequence[str]] | None,
                    precision: str, n_hard: int, example_positives: bool, label: str, device: str = "cpu") -> dict:
    """One fine-tuning of the bi-encoder, starting from `embedder`'s weights, on (request, tool doc text, hard
    negative docs) items.

    The requests are the tools' example requests when `examples` (one list per tool) is given, else
    registry-derived ones (textgen.training_queries). Hard negatives of a request = the `n_hard` tools `embedder`
    (the model this round starts from) ranks highest among the wrong ones whose text differs from the right one's
    (an exact duplicate in another server generation is not wrong; two copies of one wrong text count once); the
    loss is in-batch-negatives softmax
    (MNRL) with those extra negatives. With `examples`, `example_positives` adds, for each request of a tool with
    several, a second item whose positive is another example request of that tool: the index scores a tool by the
    max over its vectors, most of them example requests, so requests of one tool are taught to meet each other as
    well as the tool's text. Texts of one tool are one class in the loss, so they never act as each other's
    negatives. Saves the model to out_dir and returns its log (the caller writes the record)."""
    if n_hard < 1:
        raise NexusError(f"n_hard must be at least 1, got {n_hard}")
    t0 = time.perf_counter()
    rng = random.Random(seed)
    docs = [textgen.doc_text(t) for t in tools]
    dv = embedder.encode(docs, batch_size=32)
    qs, owners = [], []
    for i, t in enumerate(tools):
        for q in (examples[i] if examples is not None else textgen.training_queries(t, rng, n_queries)):
            qs.append(q)
            owners.append(i)
    if not qs:
        raise NexusError("no requests to fine-tune the embedder on")
    qv = embedder.encode(qs, batch_size=64, role="query")
    sims = qv @ dv.T
    text_id = {d: k for k, d in enumerate(dict.fromkeys(docs))}
    doc_text = np.asarray([text_id[d] for d in docs])
    sims[doc_text[None, :] == doc_text[np.asarray(owners)][:, None]] = -np.inf  # the tool itself and its exact twins
    hard = [_distinct_top(row, doc_text, n_hard) for row in sims]
    items = [(q, docs[o], [docs[h] for h in hs]) for q, o, hs in zip(qs, owners, hard)]
    labels = [(int(doc_text[o]), [int(doc_text[h]) for h in hs]) for o, hs in zip(owners, hard)]
    example_positives = example_positives and examples is not None  # measured on example requests only
    if example_positives:
        by_tool: dict[int, list[str]] = {}
        for q, o in zip(qs, owners):
            by_tool.setdefault(o, []).append(q)
        for (q, _doc, negs), lab, o in list(zip(items, labels, owners)):  # the same negatives, another positive
            others = [x for x in by_tool[o] if x != q]
            if others:
                items.append((q, rng.choice(others), negs))
                labels.append(lab)
    mined_s = time.perf_counter() - t0
    cb = (lambda s, n: progress(label, s, n)) if progress else None
    log = finetune_biencoder(embedder.path, items, out_dir, epochs=epochs, batch_size=batch_size, lr=lr,
                             time_budget_s=time_budget_s, seed=seed, callback=cb, precision=precision, labels=labels,
                             device=device)
    info = {"base": Path(embedder.path).name, "n_triples": len(qs), "n_items": len(items), "batch_size": batch_size,
            "loss": f"MNRL + {n_hard} mined hard negative{'s' if n_hard > 1 else ''}"
                    + (" + other example requests as positives" if example_positives else ""),
            "epochs": epochs, "lr": lr, "n_hard": n_hard, "example_positives": example_positives,
            "mining_seconds": round(mined_s, 1), "train": log, "seed": seed, "on_examples": examples is not None,
            "data": "example requests (nexus index --examples)" if examples is not None
                    else "textgen.training_queries (registry only)"}
    return info


def _distinct_top(scores: np.ndarray, text_of: np.ndarray, n: int) -> list[int]:
    """The n highest-scoring indices with pairwise different texts (two copies of one wrong tool are one negative)."""
    picked: list[int] = []
    for h in np.argsort(-scores, kind="stable"):
        if len(picked) == n or not np.isfinite(scores[h]):
            break
        if all(text_of[h] != text_of[x] for x in picked):
            picked.append(int(h))
    return picked
