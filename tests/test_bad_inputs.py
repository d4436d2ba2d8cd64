"""The bad-input matrix: every row is a damaged or hostile input run through the real CLI (`.venv/bin/nexus` in a
subprocess). Each must exit non-zero with exactly one line on stderr that starts with "error:" (no traceback) and
leave no file behind in the output directory.

.atb rows go through `nexus splice` with blocks that the real `nexus compile` produced for SmolLM2-135M (then
damaged byte by byte); the model-mismatch row splices them into Qwen2.5-0.5B. Registry rows go through both
`nexus index` and `nexus compile`. Model rows point NEXUS_MODELS at a temp dir with a missing, short or
wrong-checksum file. The full-disk rows write into a small tmpfs (root can mount one here); the unwritable-output
rows into a read-only tmpfs (root ignores file modes, so chmod would prove nothing).

Per-tool schema problems ($ref cycles, non-object roots, unknown types) are not fatal by design: one odd schema
must not stop a 955-tool registry (nexus_cli/registry.py). Those rows assert the other half of the contract: the
command succeeds and states the reason for that tool (index: tools.json problems; compile: the block is still
written). An enormous description is fatal for `nexus compile` (the rendered schema would not fit the context).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Callable

import pytest

from nexus_cli import atb

REPO = Path(__file__).resolve().parent.parent
NEXUS = REPO / ".venv" / "bin" / "nexus"
if not NEXUS.exists():  # an installed entry point elsewhere (CI with another venv): same CLI through -m
    NEXUS = None

pytestmark = pytest.mark.slow

TINY = {"server": "mini", "tools": [
    {"name": "ping", "description": "Check that a host answers.",
     "inputSchema": {"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"]}}]}


def nexus(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [str(NEXUS)] if NEXUS else [sys.executable, "-m", "nexus_cli.cli"]
    e = {**os.environ, "NEXUS_DEBUG": "0", **(env or {})}
    return subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=e)


def files_under(d: Path) -> list[str]:
    if not d.exists():
        return []
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() or p.is_symlink())


def assert_one_line_error(r: subprocess.CompletedProcess, expect: str) -> str:
    err = r.stderr.strip()
    assert r.returncode != 0, f"exit 0 for a bad input; stdout: {r.stdout[-400:]!r}"
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1, f"stderr is {len(lines)} lines:\n{err[-2000:]}"
    assert lines[0].startswith("error:"), lines[0]
    assert expect.lower() in lines[0].lower(), f"expected {expect!r} in: {lines[0]}"
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- fixtures: real blocks, mounts

@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad-inputs")


@pytest.fixture(scope="module")
def tiny_registry(work) -> Path:
    p = work / "tiny.json"
    p.write_text(json.dumps(TINY))
    return p


@pytest.fixture(scope="module")
def smol_block(work, tiny_registry) -> Path:
    """A block compiled by the real `nexus compile` for SmolLM2-135M (flash attention off: transposed V)."""
    out = work / "blocks"
    r = nexus("compile", str(tiny_registry), "--model", "smollm2-135m", "--out", str(out))
    assert r.returncode == 0, r.stderr
    block = out / "mini__ping.atb"
    atb.open_block(block).close()
    return block


class Mounts:
    """tmpfs mounts made by this module (root only), unmounted at the end."""

    def __init__(self):
        self.points: list[Path] = []

    def tmpfs(self, where: Path, size: str, readonly: bool = False) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        opts = f"size={size}" + (",ro" if readonly else "")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); needs root")
        self.points.append(where)
        return where

    def close(self):
        for p in reversed(self.points):
            subprocess.run(["umount", "-l", str(p)], capture_output=True)


@pytest.fixture(scope="module")
def mounts():
    m = Mounts()
    yield m
    m.close()


# ---------------------------------------------------------------- .atb damage helpers

def _raw(block: Path) -> bytearray:
    return bytearray(block.read_bytes())


def _with_header(raw: bytearray, fix_crc: bool = True, **fields) -> bytearray:
    h = atb.BlockHeader.unpack(bytes(raw[:128]))
    h = dataclasses.replace(h, **fields)
    packed = bytearray(h.pack())
    if fix_crc:
        packed[12:16] = b"\0\0\0\0"
        packed[12:16] = zlib.crc32(bytes(packed)).to_bytes(4, "little")
    raw[:128] = packed
    return raw


def _flip(raw: bytearray, offset: int, bit: int = 0) -> bytearray:
    raw[offset] ^= 1 << bit
    return raw


def _payload_offset(raw: bytearray) -> int:
    h = atb.BlockHeader.unpack(bytes(raw[:128]))
    return h.k_offset + 7


# (id, damage(raw) -> bytes, expected text in the error line)
ATB_ROWS: list[tuple[str, Callable[[bytearray], bytes], str]] = [
    ("zero-length", lambda r: b"", "truncated: file is 0 bytes"),
    ("truncated-header", lambda r: bytes(r[:77]), "truncated: file is 77 bytes"),
    ("truncated-payload", lambda r: bytes(r[: len(r) // 2]), "truncated: V section ends"),
    ("truncated-last-byte", lambda r: bytes(r[:-1]), "truncated: V section ends"),
    ("bitflip-header", lambda r: bytes(_flip(r, 60, 3)), "header checksum mismatch"),
    ("bitflip-payload", lambda r: bytes(_flip(r, _payload_offset(r), 5)), "payload checksum mismatch"),
    ("bitflip-tokens", lambda r: bytes(_flip(r, 130, 0)), "payload checksum mismatch"),
    ("wrong-magic", lambda r: b"GGUF" + bytes(r[4:]), "bad magic"),
    ("wrong-version", lambda r: bytes(_with_header(r, fix_crc=True, version=2)), "unsupported .atb version 2"),
    ("wrong-header-size", lambda r: bytes(_with_header(r, header_size=64)), "bad header size 64"),
    ("wrong-header-crc", lambda r: bytes(_with_header(r, fix_crc=False, header_crc32=0xDEADBEEF)),
     "header checksum mismatch"),
    ("wrong-payload-crc", lambda r: bytes(_with_header(r, payload_crc32=0x12345678)), "payload checksum mismatch"),
    ("bad-tokens-offset", lambda r: bytes(_with_header(r, tokens_offset=130)), "bad tokens_offset 130"),
    ("k-offset-unaligned", lambda r: bytes(_with_header(
        r, k_offset=atb.BlockHeader.unpack(bytes(r[:128])).k_offset + 64)), "is not aligned to"),
    ("v-offset-past-end", lambda r: bytes(_with_header(r, v_offset=1 << 40)), "truncated: V section ends"),
    ("offsets-overflow", lambda r: bytes(_with_header(r, v_offset=(1 << 64) - (1 << 21))), "overflow"),
    ("k-after-v", lambda r: bytes(_with_header(r, v_offset=atb.BlockHeader.unpack(bytes(r[:128])).k_offset)),
     "after V section start"),
    ("alignment-not-power-of-two", lambda r: bytes(_with_header(r, payload_align=3 << 20)), "payload_align"),
    ("n-layer-zero", lambda r: bytes(_with_header(r, n_layer=0)), "n_layer: 0"),
    ("arch-unterminated", lambda r: bytes(_with_header(r, arch="x" * 12)), "arch"),
]


@pytest.mark.parametrize("row_id,damage,expect", ATB_ROWS, ids=[r[0] for r in ATB_ROWS])
def test_damaged_block_is_refused(work, smol_block, row_id, damage, expect):
    d = work / f"atb-{row_id}"
    d.mkdir()
    bad = d / "block.atb"
    bad.write_bytes(damage(_raw(smol_block)))
    before = files_under(d)
    r = nexus("splice", "--block", str(bad), "--model", "smollm2-135m", "--repeat", "1")
    assert_one_line_error(r, expect)
    assert files_under(d) == before


def test_block_from_another_model_is_refused(work, smol_block):
    """A SmolLM2 block spliced into Qwen2.5-0.5B: refused on the fingerprint before anything touches the context."""
    from nexus_cli.models import MODELS, is_verified

    if not is_verified(MODELS["qwen2.5-0.5b"]):
        pytest.skip("qwen2.5-0.5b is not in the models cache (make models)")
    r = nexus("splice", "--block", str(smol_block), "--model", "qwen2.5-0.5b", "--repeat", "1")
    assert_one_line_error(r, "was compiled for model fingerprint")


@pytest.mark.parametrize("field,value,expect", [
    ("freq_base", 500000.0, "rope freq_base"),
    ("freq_scale", 0.5, "rope freq_scale"),
    ("rope_type", "other", "rope type"),
    ("n_rot", 32, "rope n_rot"),
    ("yarn_beta_fast", 16.0, "yarn beta_fast"),
])
def test_block_with_other_rope_parameters_is_refused(work, smol_block, field, value, expect):
    d = work / f"rope-{field}"
    d.mkdir()
    bad = d / "block.atb"
    raw = _raw(smol_block)
    if value == "other":  # the rope type the model does not use
        value = atb.ROPE_NEOX if atb.BlockHeader.unpack(bytes(raw[:128])).rope_type == atb.ROPE_NORM else atb.ROPE_NORM
    bad.write_bytes(bytes(_with_header(raw, **{field: value})))
    atb.open_block(bad).close()  # a well-formed block: only the model check can refuse it
    r = nexus("splice", "--block", str(bad), "--model", "smollm2-135m", "--repeat", "1")
    assert_one_line_error(r, expect)


def test_block_with_other_v_layout_is_refused(smol_block):
    """Compiled with flash attention off (transposed V), spliced with it on."""
    r = nexus("splice", "--block", str(smol_block), "--model", "smollm2-135m", "--flash-attn", "on", "--repeat", "1")
    assert_one_line_error(r, "V layout")


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_block_path_that_is_not_a_block(work, kind):
    p = work / f"not-a-block-{kind}"
    if kind == "directory":
        p.mkdir()
    r = nexus("splice", "--block", str(p), "--model", "smollm2-135m")
    assert_one_line_error(r, str(p.name))


# ---------------------------------------------------------------- registries: through index and compile

def _deep(n: int) -> str:
    return '{"tools": ' + "[" * n + "]" * n + "}"


REGISTRY_ROWS: list[tuple[str, Callable[[Path], list[Path]], str]] = [
    ("empty-file", lambda d: [_write(d / "r.json", b"")], "is empty"),
    ("whitespace-only", lambda d: [_write(d / "r.json", b"  \n\t ")], "not valid JSON"),
    ("invalid-json", lambda d: [_write(d / "r.json", b'{"tools": [{"name": "a",}]}')], "not valid JSON"),
    ("truncated-json", lambda d: [_write(d / "r.json", json.dumps(TINY).encode()[:50])], "not valid JSON"),
    ("non-utf8", lambda d: [_write(d / "r.json", b'{"tools": [{"name": "caf\xe9"}]}')], "not UTF-8"),
    ("utf16-bom", lambda d: [_write(d / "r.json", json.dumps(TINY).encode("utf-16"))], "not UTF-8"),
    ("duplicate-names", lambda d: [_write(d / "r.json", json.dumps(
        {"server": "s", "tools": [TINY["tools"][0], TINY["tools"][0]]}).encode())], "duplicate tool name 'ping'"),
    ("duplicate-across-files", lambda d: [_write(d / "a.json", json.dumps(TINY).encode()),
                                          _write(d / "b.json", json.dumps(TINY).encode())], "duplicate tool"),
    ("no-tools-array", lambda d: [_write(d / "r.json", b'{"server": "s"}')], 'no "tools" array'),
    ("tools-not-array", lambda d: [_write(d / "r.json", b'{"tools": {"a": 1}}')], "is not an array"),
    ("root-is-number", lambda d: [_write(d / "r.json", b"42")], "expected a JSON object"),
    ("tool-not-object", lambda d: [_write(d / "r.json", b'{"tools": ["ping"]}')], "is not an object"),
    ("tool-without-name", lambda d: [_write(d / "r.json", b'{"tools": [{"description": "x"}]}')], "has no name"),
    ("no-tools", lambda d: [_write(d / "r.json", b'{"tools": []}')], "holds no tools"),
    ("nested-too-deep", lambda d: [_write(d / "r.json", _deep(100_000).encode())], "nested too deeply"),
    ("missing-file", lambda d: [d / "nope.json"], "does not exist"),
    ("empty-directory", lambda d: [_mkdir(d / "emptydir")], "no registry files"),
]


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


@pytest.mark.parametrize("command", ["index", "compile"])
@pytest.mark.parametrize("row_id,make,expect", REGISTRY_ROWS, ids=[r[0] for r in REGISTRY_ROWS])
def test_bad_registry_is_refused(work, command, row_id, make, expect):
    d = work / f"reg-{command}-{row_id}"
    regs = make(d / "in")
    out = d / "out"
    args = ["index", *map(str, regs), "--out", str(out)] if command == "index" else \
        ["compile", *map(str, regs), "--model", "smollm2-135m", "--out", str(out)]
    r = nexus(*args)
    assert_one_line_error(r, expect)
    assert files_under(out) == [], f"partial output: {files_under(out)}"


def test_enormous_description_is_refused_by_compile(work):
    """A description far over the context: compile names the tool and refuses, writing nothing."""
    d = work / "huge-desc"
    reg = _write(d / "r.json", json.dumps({"server": "big", "tools": [
        {"name": "essay", "description": "lorem ipsum dolor sit amet " * 20000,
         "inputSchema": {"type": "object", "properties": {}}}]}).encode())
    out = d / "out"
    r = nexus("compile", str(reg), "--model", "smollm2-135m", "--out", str(out))
    assert_one_line_error(r, "big/essay")
    assert files_under(out) == []


ODD_SCHEMAS = {
    "ref-cycle": {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                  "properties": {"x": {"$ref": "#/$defs/a"}}},
    "non-object-root": {"type": "string"},
    "unknown-type": {"type": "object", "properties": {"w": {"type": "widget"}}},
    "remote-ref": {"type": "object", "properties": {"q": {"$ref": "https://example.com/x.json"}}},
    "huge-description-field": {"type": "object", "properties": {"x": {"type": "string",
                                                                      "description": "word " * 50000}}},
}


def test_odd_schemas_index_with_a_stated_reason(work):
    """Per-tool schema problems are recorded, not fatal: the registry indexes, and each odd tool gets a signature
    and grammar or a one-line reason (the contract of nexus_cli.schema.compile_tool)."""
    from nexus_cli.registry import load_registries
    from nexus_cli.schema import compile_tool

    d = work / "odd-schemas"
    tools = [{"name": n, "description": f"odd schema {n}", "inputSchema": s} for n, s in ODD_SCHEMAS.items()]
    tools.append(TINY["tools"][0])
    reg = _write(d / "odd.json", json.dumps({"server": "odd", "tools": tools}).encode())
    for t in load_registries([reg]):
        spec = compile_tool(t)
        assert spec.grammar is not None or spec.problems, t.key
        assert not any("internal error" in p for p in spec.problems), (t.key, spec.problems)
        if t.name in ("ref-cycle", "non-object-root", "remote-ref"):
            assert spec.problems, f"{t.key}: no reason stated for an odd schema"
    r = nexus("index", str(reg), "--out", str(d / "index"), "--no-lexical")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- models

def _models_env(tmp: Path) -> dict:
    return {"NEXUS_MODELS": str(tmp)}


def test_missing_model(work, tiny_registry):
    d = work / "model-missing"
    (d / "models").mkdir(parents=True)
    out = d / "out"
    r = nexus("compile", str(tiny_registry), "--model", "smollm2-135m", "--out", str(out), env=_models_env(d / "models"))
    assert_one_line_error(r, "is not in")
    assert files_under(out) == []


@pytest.mark.parametrize("kind", ["wrong-size", "wrong-checksum"])
def test_corrupt_model_file(work, tiny_registry, kind):
    from nexus_cli.config import MODELS

    spec = MODELS["smollm2-135m"]
    d = work / f"model-{kind}"
    models = d / "models"
    models.mkdir(parents=True)
    f = models / spec.filename
    with open(f, "wb") as fh:
        fh.write(b"GGUF")
        fh.truncate(spec.size if kind == "wrong-checksum" else 12345)  # sparse: same size, other bytes
    out = d / "out"
    r = nexus("compile", str(tiny_registry), "--model", "smollm2-135m", "--out", str(out), env=_models_env(models))
    assert_one_line_error(r, "fails its sha256 check")
    assert files_under(out) == []
    r = nexus("splice", "--block", str(REPO / "tests" / "golden" / "v1-rows.atb"), "--model", "smollm2-135m",
              env=_models_env(models))
    assert_one_line_error(r, "sha256")


def test_bundled_router_embedder_damaged_is_refused(tmp_path, monkeypatch):
    """The shipped router embedder is verified in place: a missing or altered weights file is one line that says how
    to restore it, never a silently different model."""
    import dataclasses

    from nexus_cli import config, models
    from nexus_cli.errors import ModelError

    spec = config.MODELS["nexus-router"]
    copy = tmp_path / "router-embedder"
    copy.mkdir()
    fake = dataclasses.replace(spec, filename=str(copy))  # an absolute filename wins over REPO_ROOT
    monkeypatch.setitem(config.MODELS, "nexus-router", fake)
    monkeypatch.setenv("NEXUS_MODELS", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="missing or fails its sha256 check") as e:
        models.resolve_model("nexus-router", kind="embedder")
    assert "git checkout" in (e.value.hint or "")
    src = models.REPO_ROOT / spec.filename / "model.safetensors"
    data = bytearray(src.read_bytes())
    data[-1] ^= 0xFF
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="fails its sha256 check"):
        models.resolve_model("nexus-router", kind="embedder")
    with pytest.raises(ModelError, match="fails its sha256 check"):
        models.fetch(fake, log=lambda m: None)


def test_model_path_that_is_not_gguf(work, tiny_registry):
    d = work / "model-not-gguf"
    bogus = _write(d / "model.gguf", b"this is not a model\n" * 10)
    out = d / "out"
    r = nexus("compile", str(tiny_registry), "--model", str(bogus), "--out", str(out))
    assert_one_line_error(r, "not a GGUF file")
    assert files_under(out) == []


# ---------------------------------------------------------------- unwritable output, full disk

@pytest.mark.parametrize("command", ["index", "compile"])  # regression: bug R2
def test_unwritable_output_directory(work, mounts, tiny_registry, command):
    ro = mounts.tmpfs(work / f"ro-{command}", "1m", readonly=True)
    out = ro / "out"
    args = ["index", str(tiny_registry), "--out", str(out)] if command == "index" else \
        ["compile", str(tiny_registry), "--model", "smollm2-135m", "--out", str(out)]
    r = nexus(*args)
    assert_one_line_error(r, "read-only file system")
    assert files_under(ro) == []


@pytest.mark.parametrize("command", ["index", "compile"])  # regression: bug R3
def test_output_path_is_a_file(work, tiny_registry, command):
    d = work / f"out-is-file-{command}"
    f = _write(d / "taken", b"not a directory\n")
    args = ["index", str(tiny_registry), "--out", str(f)] if command == "index" else \
        ["compile", str(tiny_registry), "--model", "smollm2-135m", "--out", str(f)]
    r = nexus(*args)
    assert_one_line_error(r, str(f.name))
    assert f.read_bytes() == b"not a directory\n"
    assert files_under(d) == ["taken"]


@pytest.mark.parametrize("command,size", [
    ("compile", "512k"),
    ("index", "16k"),  # regression: bug R4
])
def test_full_disk(work, mounts, tiny_registry, command, size):
    """A tmpfs too small for the output: the write fails part-way; the error is one line and nothing is left."""
    full = mounts.tmpfs(work / f"full-{command}", size)
    out = full / "out"
    if command == "compile":
        r = nexus("compile", str(tiny_registry), "--model", "smollm2-135m", "--out", str(out))
    else:
        reg = REPO / "tool_registries"
        r = nexus("index", str(reg), "--out", str(out), "--no-lexical")
    assert_one_line_error(r, "no space left on device")
    assert files_under(full) == [], f"left behind on a full disk: {files_under(full)}"
