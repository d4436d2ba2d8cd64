"""The results writer: required fields, atomic files, latest.json, PNG figures, no hostname."""

import json
import socket
from pathlib import Path

import numpy as np
import pytest

from nexus_cli.lab import results, stats


def _doc(tmp_path, figure=None):
    run = results.Run("unit-suite", params={"depths": [256, 512], "trials": 2}, seed=11, models={})
    run.note("a note")
    summary = {"acc": stats.wilson(3, 4), "nan": float("nan"), "arr": np.arange(3)}
    return run.write(summary, samples={"ms": [1.0, 2.0]}, out_dir=tmp_path, figure=figure)


def test_required_fields(tmp_path):
    doc = _doc(tmp_path)
    for key in ("schema", "suite", "created_utc", "wall_s", "argv", "environment", "models", "params", "seed",
                "summary", "samples", "notes"):
        assert key in doc, key
    env = doc["environment"]
    assert env["git"]["sha"] is None or len(env["git"]["sha"]) == 40
    assert "dirty" in env["git"]
    assert env["nexus"]
    assert "llama-cpp-python" in env["packages"] and "numpy" in env["packages"] and "torch" in env["packages"]
    assert env["llama_cpp"]["vendored_commit"] == "0c1e5709"
    assert env["cpu"]["model"] and env["cpu"]["logical_cores"] >= 1
    assert "simd_level" in env
    assert doc["params"] == {"depths": [256, 512], "trials": 2}
    assert doc["seed"] == 11
    assert doc["summary"]["acc"]["method"] == "wilson"
    assert doc["summary"]["nan"] is None  # NaN is written as null: strict JSON
    assert doc["summary"]["arr"] == [0, 1, 2]
    assert doc["notes"][0] == "a note"  # (a load-average note may follow on a busy machine)
    assert doc["publishable"] == (not env["git"]["dirty"])


def test_files_written_atomically(tmp_path):
    doc = _doc(tmp_path)
    folder = tmp_path / "unit-suite"
    stamped = [p for p in folder.iterdir() if p.name.startswith("unit-suite-") and p.suffix == ".json"]
    assert len(stamped) == 1
    latest = json.loads((folder / "latest.json").read_text())
    assert latest == json.loads(stamped[0].read_text())
    assert latest["samples"] == {"ms": [1.0, 2.0]}
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no temporaries left behind
    assert doc["files"]["latest"].endswith("latest.json")


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "x.json"
    results.write_json_doc(target, {"a": 1})

    class Bad:
        pass

    with pytest.raises(TypeError):
        results.write_json_doc(target, {"a": Bad()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_no_hostname(tmp_path):
    _doc(tmp_path)
    text = (tmp_path / "unit-suite" / "latest.json").read_text()
    host = socket.gethostname()
    if len(host) >= 4:
        assert host not in text


def test_png_figure(tmp_path):
    pytest.importorskip("matplotlib")

    def fig(plt):
        f, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        return f

    doc = _doc(tmp_path, figure=fig)
    png = tmp_path / "unit-suite" / "latest.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["files"]["png"] == str(png)


def test_model_identity_smollm2():
    from nexus_cli.config import MODELS
    from nexus_cli.models import is_verified

    if not is_verified(MODELS["smollm2-135m"]):
        pytest.skip("smollm2 not fetched")
    ident = results.model_identity("smollm2-135m")
    assert ident["sha256"] == MODELS["smollm2-135m"].sha256 and ident["size"] == MODELS["smollm2-135m"].size
    assert ident["name"] == "smollm2-135m"


def test_a_dirty_tree_never_replaces_the_published_latest(tmp_path, monkeypatch):
    """Into the published results folder, a run from a dirty tree keeps its own file but leaves latest.json alone;
    from a clean tree it replaces it."""
    monkeypatch.setattr(results, "PUBLISHED_RESULTS", tmp_path)
    clean = results.Run("unit-suite", params={}, models={})
    clean.git_start = {"sha": "a" * 40, "short": "aaaaaaaa", "dirty": False}
    first = clean.write({"x": 1}, out_dir=tmp_path)
    assert first["publishable"] and (tmp_path / "unit-suite" / "latest.json").is_file()
    dirty = results.Run("unit-suite", params={}, models={})
    dirty.started += 2  # a later timestamp
    dirty.git_start = {"sha": "b" * 40, "short": "bbbbbbbb", "dirty": True}
    second = dirty.write({"x": 2}, out_dir=tmp_path)
    assert second["publishable"] is False and "latest" not in second["files"]
    assert json.loads((tmp_path / "unit-suite" / "latest.json").read_text())["summary"] == {"x": 1}
    stamped = json.loads(open(second["files"]["json"]).read())
    assert stamped["summary"] == {"x": 2} and stamped["publishable"] is False


def test_a_run_on_another_model_is_a_variant_beside_the_main_figures(tmp_path):
    """The main model's run is latest.json; a run on another model writes latest-<model>.json and never replaces it."""
    assert results.model_variant("qwen2.5-0.5b") is None
    assert results.model_variant("smollm2-135m") == "smollm2-135m"
    assert results.model_variant("/models/Some-Model.Q4_K_M.gguf") == "Some-Model.Q4_K_M"
    main = results.Run("unit-suite", params={}, models={}).write({"x": 1}, out_dir=tmp_path)
    other = results.Run("unit-suite", params={}, models={}, variant="smollm2-135m")
    other.started += 2
    doc = other.write({"x": 2}, out_dir=tmp_path)
    folder = tmp_path / "unit-suite"
    assert doc["variant"] == "smollm2-135m" and Path(doc["files"]["json"]).name.startswith("unit-suite-smollm2-135m-")
    assert results.load_latest(tmp_path, "unit-suite")["summary"] == main["summary"] == {"x": 1}
    assert results.load_latest(tmp_path, "unit-suite", "smollm2-135m")["summary"] == {"x": 2}
    assert results.variants(tmp_path, "unit-suite") == ["smollm2-135m"] and (folder / "latest-smollm2-135m.json").is_file()


def test_the_latency_baseline_gets_the_packages_its_commit_pins():
    """`nexus bench latency` runs the baseline commit's one-shot route with the packages that commit's pyproject.toml
    pins where this environment differs (lab.bench_latency.unsatisfied picks them)."""
    from importlib.metadata import version

    from nexus_cli.lab.bench_latency import unsatisfied

    numpy_now = version("numpy")
    assert unsatisfied([f"numpy=={numpy_now}", "numpy>=1"]) == []
    assert unsatisfied([f"numpy!={numpy_now}"]) == [f"numpy!={numpy_now}"]
    assert unsatisfied(["no-such-package-for-nexus==1.0"]) == ["no-such-package-for-nexus==1.0"]
