"""BM25 of the lexical half: the lazily built postings score exactly as the textbook formula over a dense matrix."""

import math

import numpy as np

from nexus_cli.routing.lexical import BM25


def dense_bm25(docs, query, k1=1.2, b=0.75):
    vocab = sorted({t for d in docs for t in d})
    tf = np.asarray([[d.count(t) for t in vocab] for d in docs], dtype=np.float64)
    lens = tf.sum(axis=1)
    norm = k1 * (1 - b + b * lens / lens.mean())
    df = (tf > 0).sum(axis=0)
    out = np.zeros(len(docs))
    for t in set(query):
        if t not in vocab:
            continue
        j = vocab.index(t)
        idf = math.log(1 + (len(docs) - df[j] + 0.5) / (df[j] + 0.5))
        out += idf * np.where(tf[:, j] > 0, tf[:, j] * (k1 + 1) / (tf[:, j] + norm), 0.0)
    return out


def test_bm25_matches_the_dense_formula_and_caches_tokens():
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(40)]
    docs = [list(rng.choice(words, size=int(rng.integers(1, 30)))) for _ in range(60)] + [[]]
    bm = BM25(docs)
    for _ in range(30):
        q = list(rng.choice(words + ["unseen"], size=int(rng.integers(1, 8))))
        np.testing.assert_allclose(bm.scores(q), dense_bm25(docs, q), rtol=1e-12, atol=0)
    first = bm.scores(["w1", "w2"])
    assert np.array_equal(bm.scores(["w2", "w1", "w1"]), first)  # repeated and reordered tokens: the same scores
    assert not bm.scores(["unseen"]).any()
