"""What analyzers look for in each engine's code is data (knowledge/engines/*.toml), read by them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rca.knowledge import CatalogError, engines, load_engines

from rca.sdk.engines import ALL_HANDOFFS, HANDOFFS, PIPELINE_SETTINGS, handoffs


def test_the_analyzers_look_for_every_engines_handoffs_and_pipeline_settings() -> None:
    known = engines()
    assert {"sglang", "vllm"} <= set(known)
    assert known["sglang"].layer_handoffs == ("set_eagle3_layers_to_capture",)
    assert known["vllm"].pipeline_settings == ("pipeline_parallel_size",)
    assert set(HANDOFFS) == {name for engine in known.values() for name in engine.layer_handoffs}
    assert set(PIPELINE_SETTINGS) == {name for engine in known.values() for name in engine.pipeline_settings}
    assert all(
        engine.references and all(url.startswith("https://") for url in engine.references) for engine in known.values()
    )


def test_the_objects_that_hold_the_draft_config_are_each_engines_own() -> None:
    """`X.hf_config` is read as the draft's config.json for the names the engines declare, and only
    those: a name no engine holds its draft under is not taken for the draft's config."""
    from rca.sdk.values import DRAFT_MODEL_CONFIGS

    known = engines()
    assert "draft_model_config" in known["vllm"].draft_config_holders
    assert "draft_model_config" in known["sglang"].draft_config_holders
    assert DRAFT_MODEL_CONFIGS == {name for engine in known.values() for name in engine.draft_config_holders}
    assert "model_config" not in DRAFT_MODEL_CONFIGS


def test_a_speculative_method_with_hand_offs_of_its_own_is_followed_through_them() -> None:
    """SGLang hands DFlash's ids over through set_dflash_layers_to_capture; vLLM through the same
    method as EAGLE-3's; a method no engine declares (EAGLE, MTP) through EAGLE-3's."""
    assert "set_dflash_layers_to_capture" in handoffs("dflash") and "set_aux_hidden_state_layers" in handoffs("dflash")
    assert "set_dflash_layers_to_capture" not in handoffs("eagle3") and handoffs("eagle") == handoffs("eagle3")
    assert set(HANDOFFS) < set(ALL_HANDOFFS) and "set_dflash_layers_to_capture" in ALL_HANDOFFS


def test_an_engine_file_named_unlike_its_id_is_refused(tmp_path: Path) -> None:
    (tmp_path / "lmdeploy.toml").write_text(
        'id = "turbomind"\nname = "LMDeploy"\nlayer_handoffs = []\npipeline_settings = []\n', encoding="utf-8"
    )
    with pytest.raises(CatalogError, match="does not match the file name"):
        load_engines(tmp_path)
