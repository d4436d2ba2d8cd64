"""The CLI surface: every subcommand exists, is documented in the README, and `--help` stays light."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ["compile", "index", "route", "splice", "bench", "sweep", "serve", "results", "models"]
SUITES = {"bench": ["slb", "latency", "deep-splice", "card-splice", "routing", "routing-lso", "args", "l0"], "sweep": ["dkl", "gate"],
          "results": ["all", "summary"], "models": ["fetch", "list"]}


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "nexus_cli.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def test_help_lists_every_subcommand():
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s*[│|]?\s*{name}\b", proc.stdout, re.M), f"{name} missing from nexus --help"


@pytest.mark.parametrize("group", sorted(SUITES))
def test_groups_list_their_suites(group):
    proc = run_cli(group, "--help")
    assert proc.returncode == 0, proc.stderr
    for suite in SUITES[group]:
        assert suite in proc.stdout


def test_readme_shows_every_subcommand_and_suite():
    readme = (REPO / "README.md").read_text()
    for name in SUBCOMMANDS:
        assert re.search(rf"nexus {name}\b", readme), f"README has no example of `nexus {name}`"
    for group, suites in SUITES.items():
        for suite in suites:
            assert f"nexus {group} {suite}" in readme, f"README has no example of `nexus {group} {suite}`"
    assert "make test" in readme and "make demo" in readme


def test_help_imports_no_heavy_dependency():
    # `nexus --help` must start fast: the heavy stacks are imported lazily by the commands that need them.
    code = (
        "import sys, runpy\n"
        "sys.argv = ['nexus', '--help']\n"
        "from nexus_cli import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'llama_cpp', 'sentence_transformers', 'numpy', 'matplotlib', 'transformers') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    line = [l for l in proc.stderr.splitlines() if l.startswith("HEAVY=")]
    assert line, proc.stderr
    assert line[0] == "HEAVY=", f"--help imported heavy modules: {line[0]}"


def test_unknown_option_is_a_usage_error_without_traceback():
    proc = run_cli("route", "--no-such-option")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "error" in proc.stderr.lower()


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert re.match(r"^\d+\.\d+\.\d+", proc.stdout.strip())


def test_unknown_model_name_is_one_clear_line():
    from nexus_cli.errors import ModelError
    from nexus_cli.models import resolve_model

    with pytest.raises(ModelError, match="unknown model 'no-such-model'"):
        resolve_model("no-such-model")


def test_model_file_that_is_not_gguf_is_refused(tmp_path):
    from nexus_cli.errors import ModelError
    from nexus_cli.models import resolve_model

    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(ModelError, match="not a GGUF file"):
        resolve_model(str(bogus))


def test_a_one_shot_route_ends_its_process_right_after_its_output(tmp_path):
    """A one-shot `nexus route` asks main() to end the process once its answer is written (cli.skip_teardown): the
    answer reaches stdout whole, the exit status is the command's, and nothing after main() runs, not even atexit
    handlers. A usage error still exits the ordinary way."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('ATEXIT', file=sys.stderr))\n"
        "from nexus_cli import cli\n"
        "sys.argv = ['nexus', 'route', 'open a PR', '--json', '--no-args', '--index', sys.argv[1]]\n"
        "cli.main()\n"
        "print('AFTER', file=sys.stderr)\n"
    )
    index = tmp_path / "index"
    built = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "index", str(REPO / "tool_registries"), "--out",
                            str(index)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    proc = subprocess.run([sys.executable, "-c", code, str(index)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tool"] and "ATEXIT" not in proc.stderr and "AFTER" not in proc.stderr
    bad = subprocess.run([sys.executable, "-c", code.replace("'--no-args', ", "'--top-k', '0', "), str(index)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "ATEXIT" in bad.stderr and "AFTER" not in bad.stderr
