"""Check rca's EAGLE-3 draft runner against speculators' own Eagle3DraftModel on the same weights.

    pip install --target /tmp/specenv --no-deps speculators==0.9.0 hs-connectors==0.9.0 pydantic pydantic-core \
        pydantic-settings annotated-types typing-inspection python-dotenv loguru openai sniffio jiter distro httpx \
        httpcore h11 anyio idna certifi datasets multiprocess dill xxhash pyarrow fsspec pandas python-dateutil pytz \
        tzdata six aiohttp multidict yarl frozenlist aiosignal attrs propcache aiohappyeyeballs requests \
        charset-normalizer urllib3 tqdm filelock packaging pyyaml
    PYTHONPATH=/tmp/specenv python scripts/check_draft_against_speculators.py

speculators' package imports its whole training stack, hence the long list (about 350 MB): too
heavy for every CI run, so this is a script to run when the draft runner or speculators changes.
For each layout variant a random draft is built by speculators, saved as speculators saves it
(its `config.to_dict()` and state dict), loaded by rca, and both run the first draft step on the
same features and tokens; the script prints the largest logit difference and whether the target
tokens agree, and exits 1 if any variant differs.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from transformers import LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rca.evidence.draft_runner import load_draft

VARIANTS = ({}, {"norm_before_residual": True}, {"norm_before_fc": True}, {"fc_norm": True}, {"layers": 2})


def check(variant: dict) -> tuple[float, bool]:
    torch.manual_seed(0)
    layer = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=variant.get("layers", 1),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
    )
    layer._attn_implementation = "eager"
    options = {key: value for key, value in variant.items() if key != "layers"}
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=128, eagle_aux_hidden_state_layer_ids=[2, 4, 6], **options
    )
    model = Eagle3DraftModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # away from the initial ones, so that every weight matters
            parameter.copy_(
                torch.randn_like(parameter) * (0.3 if parameter.dim() > 1 else 0.2)
                + (0.0 if parameter.dim() > 1 else 1.0)
            )
    kept = torch.randperm(256)[:128].sort().values
    t2d = torch.zeros(256, dtype=torch.bool)
    t2d[kept] = True
    model.load_vocab_mappings(t2d, kept - torch.arange(128))
    saved = Path(tempfile.mkdtemp())
    save_file(
        {name: tensor.contiguous() for name, tensor in model.state_dict().items() if not name.startswith("verifier_")},
        saved / "model.safetensors",
    )
    (saved / "config.json").write_text(json.dumps(config.to_dict(), default=str))
    features, ids = torch.randn(1, 40, 192), torch.randint(0, 256, (1, 40))
    captured: dict[str, torch.Tensor] = {}
    handle = model.lm_head.register_forward_hook(
        lambda module, args, output: captured.setdefault("logits", output.detach())
    )
    with torch.no_grad():
        model(features, ids, torch.zeros(1, 40, dtype=torch.long), ttt_steps=1)
    handle.remove()
    draft = load_draft(saved, model.embed_tokens.weight)
    with torch.no_grad():
        logits = draft(features[0], ids[0])
    theirs = captured["logits"][0]
    return float((logits - theirs).abs().max()), bool(
        torch.equal(draft.target_tokens(logits), theirs.argmax(-1) + model.d2t[theirs.argmax(-1)])
    )


def main() -> None:
    failed = False
    for variant in VARIANTS:
        difference, same = check(variant)
        failed |= not same or difference > 1e-3
        print(
            f"{json.dumps(variant) if variant else 'default':32} max |logit difference| {difference:.1e}   same "
            f"target tokens: {same}"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
