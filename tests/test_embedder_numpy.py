"""Request embedding in NumPy (adapters.embedder.NumpyBertEncoder), held to sentence-transformers on the real MiniLM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nexus_cli.adapters.embedder import (Embedder, NumpyBertEncoder, numpy_unsupported_reason, query_embedder,
                                         read_safetensors)
from nexus_cli import kernels
from nexus_cli.errors import ModelError
from nexus_cli.models import resolve_model
from nexus_cli.registry import load_registries
from nexus_cli.routing.build import build_index
from nexus_cli.routing.router import Router, RouterConfig

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"

TEXTS = [
    "open a pull request in acme/api from feature/login into main titled Add login page",
    "Open a PR in repository from feature/login into main titled text",
    "",
    "?",
    "北京 天气 怎么样",
    "café naïve résumé — “quoted” ünïcödé",
    "   leading and trailing spaces   ",
    "a very long request " + " ".join(f"word{i}" for i in range(600)),  # past the 256-token limit: truncated
    "what's changed there that I haven't staged yet?",
]


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    return resolve_model("minilm", kind="embedder")


@pytest.fixture(scope="module")
def reference(minilm_path):
    return Embedder(str(minilm_path), query_precision="float32")


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return NumpyBertEncoder(minilm_path)


def test_numpy_encoder_matches_sentence_transformers(encoder, reference):
    assert encoder.dim == reference.dim == 384
    assert encoder.max_length == reference.model.max_seq_length == 256
    got = encoder.encode(TEXTS)
    want = reference.encode(TEXTS, role="query")
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags["C_CONTIGUOUS"]
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    # float32 both ways: the differences are rounding (a wrong GELU, mask or truncation moves them past 1e-3)
    assert float(np.abs(got - want).max()) < 2e-5
    # one text alone and inside a batch give the same vector: texts are packed without padding, each attends only
    # to its own tokens
    for i in (0, 4, 7):
        assert float(np.abs(encoder.encode_one(TEXTS[i]) - got[i]).max()) < 1e-5
    # texts of one length share one attention batch; each still attends only within itself
    same = ["open the door now", "close the gate soon", "open the door now please"]
    lengths = [len(e.ids) for e in encoder.tokenizer.encode_batch(same)]
    assert lengths[0] == lengths[1] != lengths[2]
    together = encoder.encode(same)
    assert float(np.abs(together - reference.encode(same, role="query")).max()) < 2e-5
    for i, t in enumerate(same):
        assert float(np.abs(encoder.encode_one(t) - together[i]).max()) < 1e-5
    few = encoder.encode_few(TEXTS[:2])
    assert few.shape == (2, 384) and float(np.abs(few - got[:2]).max()) < 1e-5
    assert encoder.encode([]).shape == (0, 384)


def test_shipped_router_embedder_is_float16_on_disk_and_float32_in_both_encoders():
    """models/router-embedder stores float16 weights; sentence-transformers and NumPy both run it in float32 and agree
    as they do on MiniLM, and its pinned sha256 holds."""
    from safetensors.numpy import load_file

    from nexus_cli.config import DEFAULT_EMBEDDER, MODELS
    from nexus_cli.models import is_verified

    spec = MODELS["nexus-router"]
    assert DEFAULT_EMBEDDER == "nexus-router" and spec.bundled
    path = resolve_model("router", kind="embedder")
    assert path == REPO / "models" / "router-embedder" and is_verified(spec, full=True)
    stored = load_file(str(path / "model.safetensors"))
    assert {v.dtype for v in stored.values()} == {np.dtype(np.float16)}
    torch_side = Embedder("nexus-router", query_precision="float32")
    assert {p.dtype for p in torch_side.model.parameters()} == {__import__("torch").float32}
    # the route-time encoder keeps the float16 token table; its dense layers run in libnexus (kernels.LinearF16, the
    # same float32 arithmetic in another order of sums) where that is faster than NumPy float32 (native=False),
    # and in every one-shot process (a float32 copy of the layers costs more to make than one request saves)
    auto_side = query_embedder("nexus-router")
    assert isinstance(auto_side, NumpyBertEncoder) and auto_side.word.dtype == np.float16
    assert auto_side.half == kernels.native_dense_pays()
    assert query_embedder("nexus-router", one_shot=True).half
    numpy_side = NumpyBertEncoder(path, native=True)
    f32_side = NumpyBertEncoder(path, native=False)
    assert numpy_side.half and not f32_side.half and f32_side.word.dtype == np.float16
    got, want = numpy_side.encode(TEXTS), torch_side.encode(TEXTS, role="query")
    assert float(np.abs(got - want).max()) < 2e-5
    assert float(np.abs(got - f32_side.encode(TEXTS)).max()) < 2e-5
    for text in TEXTS[:3]:  # one text alone and in a batch
        assert float(np.abs(numpy_side.encode_one(text) - f32_side.encode_one(text)).max()) < 2e-5


def _model_copy(src: Path, dst: Path) -> Path:
    """A model folder whose JSON files can be edited: small files copied, the weights linked."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_dir():
            shutil.copytree(f, dst / f.name)
        elif f.suffix == ".json" or f.suffix == ".txt":
            shutil.copy(f, dst / f.name)
        else:
            (dst / f.name).symlink_to(f)
    return dst


def _edit(path: Path, **changes) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(changes)
    path.write_text(json.dumps(data))


def test_mapped_safetensors_equal_the_library_reader_and_refuse_damage(tmp_path):
    """read_safetensors (a memory map, nothing copied) gives every tensor of the shipped router embedder as
    safetensors.numpy does, bit for bit; a cut or garbled file is refused with one ModelError."""
    from safetensors.numpy import load_file

    path = resolve_model("nexus-router", kind="embedder") / "model.safetensors"
    mapped, loaded = read_safetensors(path), load_file(str(path))
    assert sorted(mapped) == sorted(loaded)
    for name, arr in loaded.items():
        assert mapped[name].dtype == arr.dtype and mapped[name].shape == arr.shape, name
        np.testing.assert_array_equal(mapped[name], arr)
    data = path.read_bytes()
    for label, damaged in {"cut": data[: len(data) // 2], "header": data[:8] + b"{not json" + data[17:],
                           "length": (10**12).to_bytes(8, "little") + data[8:]}.items():
        bad = tmp_path / f"{label}.safetensors"
        bad.write_bytes(damaged)
        with pytest.raises(ModelError, match="cannot read"):
            read_safetensors(bad)


def test_numpy_encoder_refuses_models_it_does_not_implement(minilm_path, tmp_path):
    assert numpy_unsupported_reason(minilm_path) is None
    cases = {
        "mpnet": lambda d: _edit(d / "config.json", model_type="mpnet"),
        "relu": lambda d: _edit(d / "config.json", hidden_act="relu"),
        "cls": lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"})),
        "dense": lambda d: (d / "modules.json").write_text(json.dumps(
            json.loads((d / "modules.json").read_text()) + [{"idx": 3, "name": "3", "path": "3_Dense",
                                                              "type": "sentence_transformers.models.Dense"}])),
        "prompts": lambda d: _edit(d / "config_sentence_transformers.json", prompts={"query": "query: "}),
        "no-tokenizer": lambda d: (d / "tokenizer.json").unlink(),
    }
    expected = {"mpnet": "not a BERT model", "relu": "BERT variant", "cls": "pooling", "dense": "modules",
                "prompts": "prompts", "no-tokenizer": "no tokenizer.json"}
    for name, change in cases.items():
        folder = _model_copy(minilm_path, tmp_path / name)
        change(folder)
        why = numpy_unsupported_reason(folder)
        assert why is not None and expected[name] in why, (name, why)
        with pytest.raises(ModelError, match="cannot run in NumPy"):
            query_embedder(folder, encoder="numpy")
    # auto falls back to sentence-transformers where the NumPy encoder does not apply (a prompt is not one of its
    # features); torch always means sentence-transformers; anything else is an error
    assert isinstance(query_embedder(tmp_path / "prompts", encoder="auto"), Embedder)
    assert isinstance(query_embedder("minilm", encoder="torch"), Embedder)
    assert isinstance(query_embedder("minilm", encoder="auto"), NumpyBertEncoder)
    with pytest.raises(ModelError, match="auto, numpy or torch"):
        query_embedder("minilm", encoder="onnx")


@pytest.fixture(scope="module")
def forge_index(tmp_path_factory, reference):
    out = tmp_path_factory.mktemp("numpy-route") / "forge"
    build_index(load_registries([FORGE]), out, embedder=reference)
    return out


def test_router_embeds_requests_in_numpy_with_the_same_decisions(forge_index, reference):
    queries = [json.loads(x)["query"] for x in (REPO / "tool_registries" / "demo_queries.jsonl").read_text().splitlines()
               if x.strip()]
    fast = Router(forge_index, RouterConfig(reranker="none"))
    assert isinstance(fast.embedder, NumpyBertEncoder)  # the default (auto) for MiniLM
    slow = Router(forge_index, RouterConfig(reranker="none"), embedder=reference)
    for q in queries:
        a, b = fast.route(q, with_args=False), slow.route(q, with_args=False)
        assert (a.server, a.tool) == (b.server, b.tool)
        assert [c.tool for c in a.candidates] == [c.tool for c in b.candidates]
        # the request is INT8-quantized before the scan, so a rounding-level difference can move one component by
        # one step (~3e-4 of a score); a wrong encoder moves scores by 1e-2 and more
        assert max(abs(x.score - y.score) for x, y in zip(a.candidates, b.candidates)) < 2e-3
        assert abs(a.gate["margin"] - b.gate["margin"]) < 2e-3


# Python source for a subprocess: the heavy modules it imported, as a JSON-ready list
HEAVY = "sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules)"


def _run_json(code: str, **env_overrides) -> dict:
    """Run `code` in a fresh interpreter (NEXUS_QUERY_ENCODER as the test sets it) and read the JSON of its last
    line of output."""
    env = {k: v for k, v in os.environ.items() if k != "NEXUS_QUERY_ENCODER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**env, **env_overrides}, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_shot_route_does_not_import_torch(forge_index):
    """The point of the NumPy encoder: a `nexus route` process never imports torch or sentence-transformers."""
    code = ("import json, sys\n"
            "from nexus_cli.routing.router import Router, RouterConfig\n"
            f"r = Router({str(forge_index)!r}, RouterConfig(reranker='none'))\n"
            "res = r.route('merge PR 12 in acme/api', with_args=False)\n"
            f"print(json.dumps({{'tool': res.tool, 'heavy': {HEAVY}}}))\n")
    got = _run_json(code)
    assert got == {"tool": "merge_pull_request", "heavy": []}
    # and NEXUS_QUERY_ENCODER=torch still takes the sentence-transformers path
    got = _run_json(code, NEXUS_QUERY_ENCODER="torch")
    assert got["tool"] == "merge_pull_request" and "torch" in got["heavy"]


def test_index_build_embeds_without_torch_with_the_same_decisions(tmp_path, forge_index, minilm_path):
    """`nexus index` embeds as `nexus route` does (adapters.embedder.index_embedder): no torch import, and the index
    routes the demo requests as one built through sentence-transformers (forge_index) does."""
    out = tmp_path / "numpy-built"
    code = ("import json, sys\n"
            "from nexus_cli.registry import load_registries\n"
            "from nexus_cli.routing.build import build_index\n"
            f"rep = build_index(load_registries([{str(FORGE)!r}]), {str(out)!r}, embedder_name={str(minilm_path)!r})\n"
            f"print(json.dumps({{'tau': rep.tau, 'heavy': {HEAVY}}}))\n")
    got = _run_json(code)
    assert got["heavy"] == []
    reference_tau = json.loads((forge_index / "manifest.json").read_text())["gate"]["tau"]
    assert abs(got["tau"] - reference_tau) < 2e-3  # probes embedded alike: the calibrated threshold hardly moves
    queries = [json.loads(x)["query"] for x in (REPO / "tool_registries" / "demo_queries.jsonl").read_text().splitlines()
               if x.strip()]
    built, reference = Router(out, RouterConfig(reranker="none")), Router(forge_index, RouterConfig(reranker="none"))
    for q in queries:
        a, b = built.route(q, with_args=False), reference.route(q, with_args=False)
        assert [(c.server, c.tool) for c in a.candidates] == [(c.server, c.tool) for c in b.candidates]
        assert max(abs(x.score - y.score) for x, y in zip(a.candidates, b.candidates)) < 2e-3


def test_router_embedder_interpolation_ends_at_both_models(tmp_path):
    """benchmarks/router_embedder.py interpolate: a = 1 writes the shipped router's own bytes, a = 0 the stock
    all-MiniLM-L6-v2 rounded to float16, a = 0.5 the mean of the two; every tensor float16, tokenizer and config copied;
    an a outside [0, 1] is refused."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import router_embedder
    finally:
        sys.path.pop(0)
    from safetensors.numpy import load_file

    from nexus_cli.config import MODELS

    router = load_file(str(REPO / "models" / "router-embedder" / "model.safetensors"))
    stock = load_file(str(resolve_model("minilm", kind="embedder") / "model.safetensors"))
    one = router_embedder.interpolate(1.0, tmp_path / "a1")
    assert one["sha256"] == MODELS["nexus-router"].sha256
    assert (tmp_path / "a1" / "tokenizer.json").is_file() and (tmp_path / "a1" / "config.json").is_file()
    router_embedder.interpolate(0.0, tmp_path / "a0")
    zero = load_file(str(tmp_path / "a0" / "model.safetensors"))
    router_embedder.interpolate(0.5, tmp_path / "a05")
    half = load_file(str(tmp_path / "a05" / "model.safetensors"))
    assert set(zero) == set(router) == set(half)
    for k in router:
        assert zero[k].dtype == half[k].dtype == np.float16
        np.testing.assert_array_equal(zero[k], stock[k].astype(np.float16))
        mean = (0.5 * stock[k].astype(np.float32) + 0.5 * router[k].astype(np.float32)).astype(np.float16)
        np.testing.assert_array_equal(half[k], mean)
    assert json.loads((tmp_path / "a05" / "nexus-router.json").read_text())["interpolated"]["alpha"] == 0.5
    with pytest.raises(SystemExit):
        router_embedder.interpolate(1.5, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
