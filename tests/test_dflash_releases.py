"""DFlash drafts on real vLLM releases: their ids read in DFlash's numbering (the output of layer k,
h(k+1)) by their config's layout, the serving side read from each release's code with the method
the launch names. vLLM 0.20 took `dflash_config.target_layer_ids` as-is (every tap one layer early);
from 0.22 it adds one (https://github.com/vllm-project/vllm/pull/40727)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from tests.conftest import ROOT, write_json, write_safetensors

pytestmark = pytest.mark.release
runner = CliRunner()
QWEN3_8B = json.loads((ROOT / "tests" / "published" / "targets" / "Qwen--Qwen3-8B.json").read_text())
# A DFlash draft for Qwen3-8B in the z-lab layout: five layers, ids [1, 9, 17, 25, 33] (h2 ... h34).
DRAFT = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "block_size": 16,
    "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 151669},
}
TRAINED = ["h2", "h10", "h18", "h26", "h34"]


def _diagnose(
    tmp_path: Path, serving: str, *extra: str, draft_config: dict = DRAFT, beside: dict[str, bytes] | None = None
) -> tuple[int, dict]:
    target = write_json(tmp_path / "target" / "config.json", QWEN3_8B.get("config", QWEN3_8B))
    draft = write_json(tmp_path / "draft" / "config.json", draft_config)
    for name, data in (beside or {}).items():
        (draft.parent / name).write_bytes(data)
    result = runner.invoke(
        app,
        [
            "diagnose",
            "--serving",
            serving,
            "--target",
            str(target.parent),
            "--draft",
            str(draft.parent),
            "-f",
            "json",
            "-q",
            *extra,
        ],
    )
    return result.exit_code, json.loads(result.stdout)


def test_a_dflash_draft_on_vllm_0_33_is_consistent_under_its_layout(tmp_path: Path) -> None:
    code, data = _diagnose(tmp_path, "vllm==0.33.0")
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]
    assert data["wiring"]["serving"]["slots"] == data["wiring"]["training"]["slots"] == TRAINED
    assert any("DFlash's numbering" in item for item in data["verdict"]["assumptions"])
    assert "draft-arch-unsupported" not in [h["id"] for h in data["hypotheses"] if h["score"] > 0.01]


def test_each_runner_s_ids_reach_a_target_of_its_own(tmp_path: Path) -> None:
    """vLLM 0.33 has two runners that hand ids to the target; where one cannot read the launch's
    speculative config (here a string, no JSON object) it hands over the model's defaults. The
    runner analyzed still captures exactly its own ids: the other's never leak into its target."""
    code, data = _diagnose(tmp_path, "vllm==0.33.0", "--serving-args", '--speculative-config {"method":"dflash"}')
    assert data["wiring"]["serving"]["slots"] == TRAINED, data["wiring"]["serving"]
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]


def test_the_launch_s_method_names_the_class_vllm_builds(tmp_path: Path) -> None:
    """With `method: dflash` vLLM's config class keeps DFlashDraftModel (served as
    DFlashQwen3ForCausalLM); the draft's fc takes its five layers."""
    launch = '--speculative-config \'{"method": "dflash", "model": "draft", "num_speculative_tokens": 15}\''
    code, data = _diagnose(tmp_path, "vllm==0.33.0", "--serving-args", launch)
    assert code == 0, data["verdict"]
    assert data["wiring"]["serving"]["fc_slots"] == 5


def test_a_dflash_draft_on_vllm_0_20_is_served_one_layer_early(tmp_path: Path) -> None:
    code, data = _diagnose(tmp_path, "vllm==0.20.0")
    assert code == 1
    (top,) = [h for h in data["hypotheses"] if h["rank"] == 1]
    assert top["id"] == "layer-offset" and top["params"]["offset"] == -1
    assert data["wiring"]["serving"]["slots"] == ["h1", "h9", "h17", "h25", "h33"]
    assert any(c["path"] == "vllm/v1/worker/gpu_model_runner.py" for c in top["citations"])


def test_a_dflash_config_without_ids_is_served_an_fc_wider_than_what_is_captured(tmp_path: Path) -> None:
    """Without ids vLLM 0.33 captures the model's three default layers while its DFlash fc takes the
    draft's five layers (qwen3_dflash.py `_get_dflash_fc_input_size`): a contradiction of serving
    alone, a cause whatever training fed (which the config does not say)."""
    code, data = _diagnose(tmp_path, "vllm==0.33.0", draft_config={**DRAFT, "dflash_config": {"mask_token_id": 151669}})
    assert code == 1, data["verdict"]
    (top,) = [h for h in data["hypotheses"] if h["rank"] == 1]
    assert top["id"] == "aux-count-mismatch" and top["params"] == {"serving": 3, "training": None, "fc": 5}
    assert "names no layer ids" in data["verdict"]["summary"]
    assert any(c["path"] == "vllm/model_executor/models/qwen3_dflash.py" for c in top["citations"])


def test_a_dflash_draft_on_sglang_0_5_23_is_consistent_through_its_own_hand_off(tmp_path: Path) -> None:
    """z-lab's documented SGLang launch (https://github.com/z-lab/dflash/issues/55): SGLang hands
    DFlash's ids to the target through set_dflash_layers_to_capture, whose Qwen3 model captures
    before layer k + 1, the output of layer k: as trained."""
    launch = (
        "python -m sglang.launch_server --model-path target --speculative-algorithm DFLASH "
        "--speculative-draft-model-path draft --speculative-num-draft-tokens 16 --tp-size 1"
    )
    code, data = _diagnose(tmp_path, "sglang==0.5.23", "--serving-args", launch)
    assert code == 0, data["verdict"]
    assert data["wiring"]["serving"]["slots"] == TRAINED
    cited = [step for step in data["wiring"]["serving"]["steps"] if step["path"] == "sglang/srt/models/qwen3.py"]
    assert any("layers_to_capture" in step["code"] and "val + 1" in step["code"] for step in cited), cited


SGLANG_LAUNCH = (
    "python -m sglang.launch_server --model-path target --speculative-algorithm DFLASH "
    "--speculative-draft-model-path draft --speculative-num-draft-tokens 16"
)
# NVIDIA ModelOpt's export of a draft trained with a window on every layer: its layer types left full,
# dflash_config.use_swa and swa_window_size set (modelopt/torch/export/plugins/hf_spec_export.py).
EVERY_LAYER_WINDOWED = {
    **DRAFT,
    "sliding_window": 2048,
    "layer_types": ["full_attention"] * 5,
    "dflash_config": {**DRAFT["dflash_config"], "use_swa": True, "swa_window_size": 2048, "causal": False},
}
# The z-lab layout of a windowed draft: the windowed layers named in layer_types.
LAYERS_WINDOWED = {**DRAFT, "sliding_window": 2048, "layer_types": ["sliding_attention"] * 4 + ["full_attention"]}


@pytest.mark.parametrize(
    ("serving", "draft", "cited"),
    [
        ("sglang==0.5.23", EVERY_LAYER_WINDOWED, "sglang/srt/models/dflash.py"),
        ("vllm==0.22.0", LAYERS_WINDOWED, "vllm/model_executor/layers/attention/attention.py"),
    ],
    ids=["use-swa-on-sglang-0.5.23", "layer-types-on-vllm-0.22"],
)
def test_a_windowed_dflash_draft_served_without_its_window_is_window_ignored(
    tmp_path: Path, serving: str, draft: dict, cited: str
) -> None:
    """SGLang 0.5.23 builds each DFlash layer's window from layer_types alone, so a use_swa draft gets
    none; vLLM 0.22's DFlash layer hands its attention no window, which falls back to the target's."""
    extra = ("--serving-args", SGLANG_LAUNCH) if serving.startswith("sglang") else ()
    code, data = _diagnose(tmp_path, serving, *extra, draft_config=draft)
    assert code == 1, data["verdict"]
    top = data["hypotheses"][0]
    assert top["id"] == "window-ignored" and top["severity"] == "cause", top
    assert "2,048-token sliding window for its layer 0" in top["reason"] and "whole context" in top["reason"]
    assert any(c["path"] == cited for c in top["citations"]), top["citations"]


@pytest.mark.parametrize(
    ("serving", "draft"),
    [("vllm==0.33.0", EVERY_LAYER_WINDOWED), ("vllm==0.33.0", LAYERS_WINDOWED), ("sglang==0.5.23", LAYERS_WINDOWED)],
    ids=["use-swa-on-vllm-0.33", "layer-types-on-vllm-0.33", "layer-types-on-sglang-0.5.23"],
)
def test_a_windowed_dflash_draft_served_with_its_window_is_consistent(
    tmp_path: Path, serving: str, draft: dict
) -> None:
    """vLLM 0.33 resolves each layer's window from use_swa or layer_types; SGLang builds the layer
    types' window counted without the current token (2,047 for HF's 2,048): both as trained."""
    extra = ("--serving-args", SGLANG_LAUNCH) if serving.startswith("sglang") else ()
    code, data = _diagnose(tmp_path, serving, *extra, draft_config=draft)
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]


# ModelOpt's export of a draft trained with a causal block (dflash_draft_attention "causal"): it writes
# dflash_config.causal for every draft, since engines default differently per layer type.
CAUSAL_BLOCK = {**DRAFT, "dflash_config": {**DRAFT["dflash_config"], "causal": True}}


@pytest.mark.parametrize(
    ("serving", "cited"),
    [("vllm==0.22.0", "vllm/v1/spec_decode/dflash.py"), ("sglang==0.5.23", "sglang/srt/models/dflash.py")],
)
def test_a_causal_block_served_bidirectionally_is_causality_differs(tmp_path: Path, serving: str, cited: str) -> None:
    """vLLM 0.22 builds every DFlash draft's metadata with causal=False; SGLang 0.5.23 reads no
    dflash_config.causal and builds a draft without layer_types as an encoder-only attention."""
    extra = ("--serving-args", SGLANG_LAUNCH) if serving.startswith("sglang") else ()
    code, data = _diagnose(tmp_path, serving, *extra, draft_config=CAUSAL_BLOCK)
    assert code == 1, data["verdict"]
    top = data["hypotheses"][0]
    assert top["id"] == "causality-differs" and top["severity"] == "cause", top
    assert "attends causally within the block (dflash_config.causal true)" in top["reason"]
    assert "builds the draft's attention bidirectionally" in top["reason"]
    assert any(c["path"] == cited for c in top["citations"]), top["citations"]


@pytest.mark.parametrize(
    ("serving", "draft"),
    [
        ("vllm==0.25.0", CAUSAL_BLOCK),
        ("vllm==0.34.0", CAUSAL_BLOCK),
        ("sglang==0.5.23", {**DRAFT, "is_causal": True, "layer_types": ["full_attention"] * 5}),
    ],
    ids=["metadata-on-vllm-0.25", "per-layer-on-vllm-0.34", "is-causal-on-sglang-0.5.23"],
)
def test_a_causal_block_served_causally_is_consistent(tmp_path: Path, serving: str, draft: dict) -> None:
    """vLLM 0.25 builds the metadata from dflash_config.causal; 0.34's draft tells its runner each
    layer's causality (get_draft_attn_causal); SGLang reads is_causal for the layers layer_types names."""
    extra = ("--serving-args", SGLANG_LAUNCH) if serving.startswith("sglang") else ()
    code, data = _diagnose(tmp_path, serving, *extra, draft_config=draft)
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]
    assert "block causality" not in json.dumps(data)  # read, not left unchecked


# A DFlash draft in speculators' format (the shape speculators 0.5 exports, as in
# https://github.com/my-other-github-account/minimax-m27-dflash-end-to-end-DRAFT/blob/aaa9b3749a1e0106d797952e3b3f24ebd38f2dec/drafter_config/config.json),
# here for Qwen3-8B: ids at the top level in vLLM's numbering, the layer's config nested.
SPECULATORS_DRAFT = {
    "architectures": ["DFlashDraftModel"],
    "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34],
    "block_size": 8,
    "draft_vocab_size": 151936,
    "mask_token_id": 151669,
    "speculators_config": {"algorithm": "dflash", "verifier": {"architectures": [], "name_or_path": "Qwen/Qwen3-8B"}},
    "speculators_model_type": "dflash",
    "speculators_version": "0.5.0",
    "transformer_layer_config": {
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "vocab_size": 151936,
    },
}


def test_a_speculators_dflash_draft_raises_no_eagle3_finding(tmp_path: Path) -> None:
    """speculators 0.5 trains EAGLE-3 and DFlash drafts in one package: what its EAGLE-3 module does
    with embeddings or RoPE says nothing of its DFlash draft, and vLLM's reading of the nested
    layer config is not followed: no cause is claimed from either (the wiring stays unresolved)."""
    code, data = _diagnose(tmp_path, "vllm==0.33.0", draft_config=SPECULATORS_DRAFT)
    assert code == 3, data["verdict"]
    claimed = {h["id"] for h in data["hypotheses"] if h["score"] >= 0.1}
    assert not claimed & {"embed-scale-mismatch", "rope-mismatch"}, claimed


# What a trainer that learns the mask token's embedding apart ships beside its draft (the bytes are
# never read: a pickle, and only its presence decides).
MASK_EMBEDDING = {"mask_embedding.pt": b"PK\x03\x04 torch.save({'embedding': ..., 'mask_token_id': 151669})"}


@pytest.mark.parametrize(
    ("serving", "reader"),
    [
        ("sglang==0.5.16", None),
        ("sglang==0.5.23", "sglang/srt/speculative/dflash_worker_v2.py"),
        ("vllm==0.33.0", "vllm/model_executor/models/qwen3_dflash.py"),
    ],
)
def test_a_mask_embedding_beside_the_draft_is_read_or_its_absence_is_a_cause(
    tmp_path: Path, serving: str, reader: str | None
) -> None:
    """SGLang 0.5.16 names no mask_embedding.pt: the mask slots get the vocabulary row, a cause
    cited at the statement that takes the mask token's id. SGLang 0.5.23 and vLLM 0.33 open it, and
    the report says where."""
    code, data = _diagnose(tmp_path, serving, beside=MASK_EMBEDDING)
    if reader is None:
        assert code == 1 and data["verdict"]["root_cause"] == "mask-embedding-unread", data["verdict"]
        (top,) = [h for h in data["hypotheses"] if h["rank"] == 1]
        assert top["severity"] == "cause"
        sidecar, reader_of_id = top["citations"]
        assert sidecar["path"].endswith("draft/mask_embedding.pt") and sidecar["line"] == 1
        assert reader_of_id["path"] == "sglang/srt/speculative/dflash_utils.py"
        assert "mask_token_id" in reader_of_id["code"]
        return
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]
    assert "mask-embedding-unread" not in {h["id"] for h in data["hypotheses"]}
    notes = [note for note in data["wiring"]["serving"]["notes"] if "mask_embedding.pt is read at" in note]
    assert notes and reader in notes[0], data["notes"]


@pytest.mark.parametrize("serving", ["vllm==0.33.0", "sglang==0.5.23"])
def test_ids_in_both_numberings_that_name_the_same_layers_are_read_as_one(tmp_path: Path, serving: str) -> None:
    """speculators' conversion writes both keys, i and i - 1 (vLLM's update_dflash): the same layers."""
    both = {**DRAFT, "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34]}
    code, data = _diagnose(tmp_path, serving, draft_config=both)
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]
    assert data["wiring"]["training"]["slots"] == data["wiring"]["serving"]["slots"] == TRAINED


def test_ids_in_both_numberings_that_disagree_leave_training_open_and_say_which_input_settles_it(
    tmp_path: Path,
) -> None:
    """The same numbers under both keys (a hand conversion that copied them) name h2... in DFlash's
    numbering and h1... in vLLM's: which the draft was trained on is not in the file. Never
    consistent, never a cause: inconclusive, naming both keys and the trainer's code or dumps."""
    both = {**DRAFT, "aux_hidden_state_layer_ids": [1, 9, 17, 25, 33]}
    code, data = _diagnose(tmp_path, "vllm==0.33.0", draft_config=both)
    assert code == 3 and data["verdict"]["status"] == "inconclusive", data["verdict"]
    summary = data["verdict"]["summary"]
    assert "dflash_config.target_layer_ids [1, 9, 17, 25, 33]" in summary
    assert "aux_hidden_state_layer_ids [1, 9, 17, 25, 33]" in summary and "--training" in summary
    assert data["wiring"]["serving"]["slots"] == TRAINED  # vLLM reads dflash_config's, plus one


@pytest.mark.parametrize("serving", ["vllm==0.33.0", "sglang==0.5.23"])
def test_an_id_past_the_target_s_last_layer_is_no_layer_trained_on_and_serving_feeds_nothing_for_it(
    tmp_path: Path, serving: str
) -> None:
    """Id 36 of a 36-layer target names the output of a layer it lacks (h37): no trainer took it, so
    training is not assumed; both engines hand it on and their capture loops never reach it, so the
    fc is fed four states for five slots: a cause of serving alone
    (https://github.com/sgl-project/sglang/issues/32204)."""
    past = {**DRAFT, "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 36], "mask_token_id": 151669}}
    code, data = _diagnose(tmp_path, serving, draft_config=past)
    assert code == 1, data["verdict"]
    top = data["hypotheses"][0]
    assert top["id"] == "aux-count-mismatch" and top["params"] == {"serving": 4, "training": None, "fc": 5}
    assert "for the 5 layer ids it hands the target" in top["reason"]
    assert "h37: the 36-layer target has no such state (h0 to h36)" in data["verdict"]["summary"]
    assert data["wiring"]["training"]["slots"] == []


LAB_TARGET = ROOT / "tests" / "engine_lab" / "target"
LAB_DFLASH = json.loads((ROOT / "tests" / "engine_lab" / "dflash" / "config.json").read_text())


def _padded_lab(tmp_path: Path, padding: int, *, tokenizer: bool = True, head: bool = True, ids: int = 1024) -> Path:
    """The engine lab's target config padded by `padding` rows (its tokenizer.json beside it, which
    emits `ids` ids), and its DFlash draft of 1,024 rows without a d2t (with or without a head)."""
    config = json.loads((LAB_TARGET / "config.json").read_text())
    target = write_json(tmp_path / "target" / "config.json", {**config, "vocab_size": 1024 + padding}).parent
    if tokenizer:
        vocab = {f"t{i}": i for i in range(ids)}
        write_json(target / "tokenizer.json", {"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": []})
    draft = write_json(tmp_path / "draft" / "config.json", LAB_DFLASH).parent
    tensors = {"fc.weight": ("F16", (128, 384), None)}
    if head:
        tensors["lm_head.weight"] = ("F16", (1024, 128), None)
    write_safetensors(draft / "model.safetensors", tensors)
    return tmp_path


def _diagnose_lab(root: Path, serving: str) -> tuple[int, dict]:
    result = runner.invoke(
        app,
        ["diagnose", "--serving", serving, "--target", str(root / "target"), "--draft", str(root / "draft"),
         "-f", "json", "-q"],
    )  # fmt: skip
    return result.exit_code, json.loads(result.stdout)


PADDING_RULED = ("vocab-map-missing", "head-missing", "vocab-first-ids")


@pytest.mark.parametrize("head", [True, False], ids=["own-head", "target-head"])
@pytest.mark.parametrize("serving", ["vllm==0.33.0", "sglang==0.5.23"])
def test_a_draft_of_a_target_padded_further_needs_no_map_and_scores_with_its_head(
    tmp_path: Path, serving: str, head: bool
) -> None:
    """The target's vocabulary padded past its tokenizer (as MiMo's by 512 rows, vllm#46435): a
    draft of fewer rows holding every id the tokenizer emits is the same vocabulary. The engine lab
    serves both drafts so at 0.997 and 1.000 (dflash-padded-target, dflash-own-head-padded-target)."""
    code, data = _diagnose_lab(_padded_lab(tmp_path, 64, head=head), serving)
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]
    assert not {h["id"] for h in data["hypotheses"] if h["severity"] != "note"} & set(PADDING_RULED), data["hypotheses"]
    notes = " ".join(data["wiring"]["serving"]["notes"])
    if head and serving.startswith("vllm"):
        assert "the draft needs no vocab map: the draft's 1,024 rows hold every id" in notes, notes
    if not head:
        assert "gives the draft the target's lm_head" in notes and "draft token i is target token i" in notes, notes


def test_without_the_target_s_tokenizer_fewer_rows_and_no_map_are_a_warning_naming_it(tmp_path: Path) -> None:
    code, data = _diagnose_lab(_padded_lab(tmp_path, 64, tokenizer=False), "vllm==0.33.0")
    assert code == 0 and data["verdict"]["status"] == "consistent", data["verdict"]
    (unsure,) = [h for h in data["hypotheses"] if h["id"] == "vocab-map-missing"]
    said = " ".join(item["summary"] for item in unsure["evidence"])
    assert unsure["severity"] == "warning" and "tokenizer.json would settle it" in said, unsure


def test_a_draft_lacking_ids_the_tokenizer_emits_is_reduced_and_needs_its_map(tmp_path: Path) -> None:
    """The same 1,024 rows against a tokenizer of 1,088 ids: a reduced vocabulary, and with no d2t
    draft token i is read as target token i."""
    code, data = _diagnose_lab(_padded_lab(tmp_path, 64, ids=1088), "vllm==0.33.0")
    assert code == 1 and data["verdict"]["root_cause"] == "vocab-map-missing", data["verdict"]
    assert data["hypotheses"][0]["severity"] == "cause"
