"""The framework releases the tests read, in one place. Each is downloaded once with
`pip download --no-deps` into the rca cache; only its Python files are kept and nothing is run."""

from __future__ import annotations

SGLANG = ["0.4.10", "0.5.2", "0.5.6", "0.5.10", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.23"]
# Releases whose runner decides from the launch settings whether to capture for an EAGLE-3 draft.
SGLANG_LAUNCH_GATED = ["0.4.10", "0.5.2", "0.5.10", "0.5.12", "0.5.16", "0.5.23"]
# Releases with gpt-oss, whose layer may defer its all-reduce (up to 0.5.16) or not (0.5.23).
SGLANG_GPT_OSS = ["0.5.2", "0.5.6", "0.5.10", "0.5.16", "0.5.23"]
VLLM = ["0.9.2", "0.11.0", "0.11.1", "0.13.0", "0.17.0", "0.18.0", "0.20.0", "0.22.0", "0.30.0", "0.33.0", "0.34.0"]
# The releases whose hand-over of the target's head and embedding to the draft (a proposer class's) the
# head check reads; 0.34 moved it into functions of its runner's `spec_decode/eagle/utils.py`, which
# the check does not read yet, and says so in a note.
VLLM_HEAD_HANDOVER = [version for version in VLLM if version != "0.34.0"]
SPECULATORS = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.8.1", "0.9.0"]
SPECFORGE = ["0.1.0", "0.2.0"]
# Every lmdeploy release since EAGLE-3 arrived (0.11.0); Kimi-K2 targets from 0.17.0.
LMDEPLOY = [
    "0.11.0",
    "0.11.1",
    "0.12.0",
    "0.12.1",
    "0.12.2",
    "0.12.3",
    "0.13.0",
    "0.14.0",
    "0.15.0",
    "0.16.0",
    "0.17.0",
    "0.18.0",
]
# Trainers read from their hooks: ModelOpt's HF path from 0.35.0 (0.33.1: fields only, no capture),
# NeMo Automodel's EAGLE-3 recipe from 0.5.0 (0.4.0: none).
MODELOPT = [
    "0.33.1",
    "0.35.0",
    "0.35.1",
    "0.37.0",
    "0.39.0",
    "0.40.0",
    "0.41.0",
    "0.42.0",
    "0.43.0",
    "0.44.0",
    "0.45.0",
    "0.46.0",
    "0.46.1",
    "0.47.0",
]
NEMO_AUTOMODEL = ["0.4.0", "0.5.0", "0.6.0", "0.7.0"]

# The last release whose Qwen3 EAGLE-3 draft layer builds its attention without the draft config's
# sliding window (0.24.0 brought the class, 0.26.0 passes the window): no release above has it.
VLLM_DRAFT_WINDOW = ("vllm", "0.25.0")
# The founding case's releases.
FOUNDING_SERVING = ("sglang", "0.5.12")
FOUNDING_TRAINING = ("speculators", "0.4.0")
# The release the vLLM refactoring variants edit.
VLLM_REFACTORED = ("vllm", "0.33.0")
# Where the serving-capture hook's targets are looked for.
CAPTURE_HOOK_ENGINES = [("sglang", "0.5.12"), ("sglang", "0.5.23"), ("vllm", "0.22.0"), ("vllm", "0.33.0")]

# Every release the tests read, once each.
PINNED = sorted(
    {("sglang", version) for version in SGLANG}
    | {("vllm", version) for version in VLLM}
    | {("speculators", version) for version in SPECULATORS}
    | {("specforge", version) for version in SPECFORGE}
    | {("lmdeploy", version) for version in LMDEPLOY}
    | {("nvidia-modelopt", version) for version in MODELOPT}
    | {("nemo-automodel", version) for version in NEMO_AUTOMODEL}
    | {FOUNDING_SERVING, FOUNDING_TRAINING, VLLM_REFACTORED, VLLM_DRAFT_WINDOW, *CAPTURE_HOOK_ENGINES}
)
