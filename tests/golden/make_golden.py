"""Regenerate the golden .atb files (run from the repo root: python tests/golden/make_golden.py).

The files are committed: a change in what this prints or in the bytes written is a format change and must come
with a version bump in docs/atb-format.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from nexus_cli import atb  # noqa: E402


def golden_inputs(v_layout: int):
    n_layer, n_tokens, n_head_kv, head_dim = 2, 3, 2, 4
    row = n_head_kv * head_dim
    header = atb.BlockHeader(
        fingerprint=bytes(range(0xA0, 0xB0)), arch="qwen2", rope_type=atb.ROPE_NEOX, v_layout=v_layout, n_rot=4,
        n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim, freq_base=1000000.0, freq_scale=1.0,
        yarn_ext_factor=0.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0, n_ctx_orig=32768,
        anchor_pos=17, n_tokens=n_tokens, payload_align=64)
    tokens = np.array([151644, 8948, 198], dtype=np.int32)
    k = (np.arange(n_layer * n_tokens * row, dtype=np.float32) / 8 - 3).astype(np.float16).reshape(n_layer, n_tokens, row)
    v_rows = (np.arange(n_layer * n_tokens * row, dtype=np.float32) / -16 + 1).astype(np.float16).reshape(
        n_layer, n_tokens, row)
    v = v_rows if v_layout == atb.V_LAYOUT_ROWS else np.ascontiguousarray(v_rows.transpose(0, 2, 1))
    return header, tokens, k, v


def main() -> None:
    for name, layout in (("v1-rows", atb.V_LAYOUT_ROWS), ("v1-transposed", atb.V_LAYOUT_TRANSPOSED)):
        header, tokens, k, v = golden_inputs(layout)
        written = atb.write_block(HERE / f"{name}.atb", header, tokens, k, v)
        expected = {"header": written.to_dict(), "tokens": tokens.tolist(),
                    "k_bits": k.view(np.uint16).reshape(-1).tolist(), "v_bits": v.view(np.uint16).reshape(-1).tolist(),
                    "file_size": (HERE / f"{name}.atb").stat().st_size}
        (HERE / f"{name}.json").write_text(json.dumps(expected, indent=1) + "\n")
        print(name, written.k_offset, written.v_offset, expected["file_size"])


if __name__ == "__main__":
    main()
