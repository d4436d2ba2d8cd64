"""Write tool_registries/examples/shared_registries.tools.jsonl: the index `nexus index` uses to give the shipped example
requests to the tools of a user's registry that are tools of ../shared/registries (nexus_cli/routing/shipped_examples.py).

    python benchmarks/shipped_examples_index.py [--registry-dir ../shared/registries] [--check]

One line per tool of ../shared/registries, in registry order: its server (the servers whose tools are matched by
server and name, as `--examples` matches), its name and a fingerprint of its name and description (how a tool on
any other server is matched). Hashes only: the registries' text stays outside the project. `--check` exits 1 when
the file on disk differs from what it would write.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.lab.bench_routing import pool_tools  # noqa: E402
from nexus_cli.lab.common import registry_dir_default  # noqa: E402
from nexus_cli.routing.shipped_examples import SHIPPED_FINGERPRINTS, fingerprint  # noqa: E402


def build(registry_dir: Path) -> list[dict]:
    return [{"server": t.server, "tool": t.name, "fingerprint": fingerprint(t.name, t.description)}
            for t in pool_tools(registry_dir)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry-dir", default=None)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    rows = build(Path(a.registry_dir) if a.registry_dir else registry_dir_default())
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if a.check:
        same = SHIPPED_FINGERPRINTS.is_file() and SHIPPED_FINGERPRINTS.read_text(encoding="utf-8") == text
        print(f"{SHIPPED_FINGERPRINTS.relative_to(ROOT)}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    fd, tmp = tempfile.mkstemp(dir=SHIPPED_FINGERPRINTS.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, SHIPPED_FINGERPRINTS)
    print(f"{SHIPPED_FINGERPRINTS.relative_to(ROOT)}: {len(rows)} tools of {len({r['server'] for r in rows})} servers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
