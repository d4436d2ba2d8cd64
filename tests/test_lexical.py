"""BM25 of the lexical half: the lazily built postings score exactly as the textbook formula over a dense matrix."""

import math

import numpy as np

from nexus_cli.routing.lexical import BM25, docs_of, postings_of


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


def test_stored_postings_score_exactly_as_the_token_lists():
    """An index stores each token's postings (lexical.json format 4); they give the same bits as the token lists
    they were made from, and turn back into lists that do too (for a reader of the older format)."""
    rng = np.random.default_rng(4)
    words = [f"w{i}" for i in range(50)]
    docs = [list(rng.choice(words, size=int(rng.integers(1, 40)))) for _ in range(80)] + [[]]
    postings = postings_of(docs)
    assert postings["w1"][0::2] == sorted(postings["w1"][0::2])  # tools ascending
    stored = BM25.from_postings([len(d) for d in docs], postings)
    back = BM25(docs_of([len(d) for d in docs], postings))
    plain = BM25(docs)
    for _ in range(40):
        q = list(rng.choice(words + ["unseen"], size=int(rng.integers(1, 9))))
        want = plain.scores(q)
        assert np.array_equal(stored.scores(q), want) and np.array_equal(back.scores(q), want)
    assert stored.n == plain.n and stored.avgdl == plain.avgdl
