"""Which layers the serving target captures when the engine's config builder chooses them."""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import Analyzer, CaptureSet, Example, Fact, Finding, IdsOrigin, Reports, SideContext, Step, StepKind
from rca.sdk.engines import build_config, holder_of, spec_method, stored_step
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.sides import reads_draft
from rca.sdk.values import ConfigObj, EvalRaise, Val, describe, ints

from .capture_layers import target_class

# An engine in lmdeploy's shape: the target's builder sets the capture layers on the config for an
# EAGLE-3 draft, and the model copies them into a field its forward tests at each layer's entry.
_BUILDER = """
class ModelConfig:
    def __init__(self, num_layers):
        self.num_layers = num_layers


class AutoConfigBuilder:
    _sub_classes = []

    @classmethod
    def condition(cls, hf_config):
        raise NotImplementedError


class DefaultConfigBuilder(AutoConfigBuilder):
    @classmethod
    def condition(cls, hf_config):
        return True

    @classmethod
    def build(cls, hf_config, model_path=None, **kwargs):
        return ModelConfig(num_layers=hf_config.num_hidden_layers)


class LlamaConfigBuilder(AutoConfigBuilder):
    @classmethod
    def condition(cls, hf_config):
        return hf_config.architectures[0] in ["LlamaForCausalLM"]

    @classmethod
    def build(cls, hf_config, model_path=None, is_draft_model=False, spec_method=None, **kwargs):
        cfg = DefaultConfigBuilder.build(hf_config, model_path, **kwargs)
        if is_draft_model:
            hf_config.architectures[0] = spec_method.capitalize() + hf_config.architectures[0]
        elif spec_method is not None:
            if spec_method == "eagle3":
                num_layers = cfg.num_layers
                hf_config.aux_hidden_state_layers = {layers}
        cfg.hf_config = hf_config
        return cfg
"""
_MODEL = """
class LlamaModel(nn.Module):
    def __init__(self, config):
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.aux_hidden_state_layers = getattr(config, "aux_hidden_state_layers", tuple())

    def forward(self, input_ids, position_ids):
        hidden_states = self.embed_tokens(input_ids)
        aux_hidden_states = []
        residual = None
        for idx, decoder_layer in enumerate(self.layers):
            if idx in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = decoder_layer(hidden_states, residual=residual)
        if len(aux_hidden_states) > 0:
            aux_hidden_states = torch.cat(aux_hidden_states, dim=-1)
        return hidden_states, aux_hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, ctx_mgr=None):
        self.config = config
        self.model = LlamaModel(config)
"""

# The same capture made inside the decoder layer: asked by a flag, it returns the stream entering it.
_FLAGGED_MODEL = """
class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        self.input_layernorm = RMSNorm(config.hidden_size)

    def forward(self, hidden_states, residual=None, capture_input_residual=False):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        input_residual = residual.clone() if capture_input_residual else None
        hidden_states = self.mlp(self.self_attn(hidden_states))
        outputs = (hidden_states, residual)
        if input_residual is not None:
            outputs += (input_residual,)
        return outputs


class LlamaModel(nn.Module):
    def __init__(self, config):
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.aux_hidden_state_layers = tuple(getattr(config, "aux_hidden_state_layers", ()) or ())

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        by_layer = {}
        for idx, decoder_layer in enumerate(self.layers):
            capture = idx in self.aux_hidden_state_layers
            layer_output = decoder_layer(hidden_states, residual=residual, capture_input_residual=capture)
            hidden_states, residual = layer_output[:2]
            if capture:
                by_layer[idx] = layer_output[2]
        aux_hidden_states = torch.cat([by_layer[idx] for idx in self.aux_hidden_state_layers], dim=-1)
        return hidden_states, aux_hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, ctx_mgr=None):
        self.model = LlamaModel(config)
"""


def _files(layers: str = "(2, num_layers // 2, num_layers - 3)", model: str = _MODEL) -> dict[str, str]:
    return {"engine/configurations/builder.py": _BUILDER.format(layers=layers), "engine/models/llama.py": model}


class ConfigBuilderLayers(Analyzer):
    """Reads the capture layers an engine's config builder sets on the target's config (lmdeploy).

    ## What it reads
    The config builders (classes with a `condition(hf_config)` and a `build(hf_config, ...,
    is_draft_model, spec_method)`): the one whose condition matches the target's config is run for
    an EAGLE-3 draft, as the engine runs it before building the model, and the list of layer indices
    it assigns on the config (`hf_config.aux_hidden_state_layers = (2, L // 2, L - 3)`) is followed
    into the target model's field that its forward pass tests.

    ## Why it matters
    Such an engine chooses the layers itself: the draft config's ids are never read for the capture,
    so a draft trained on other layers is fed states it never saw, with no error.

    ## Finding
    `draft-ids-ignored`: the draft config declares layer ids other than those the builder sets, and
    the target captures the builder's. Evidence for `config-ignored`.
    """

    code = "RCA-S114"
    name = "config-builder-layers"
    sides = frozenset({"serving"})
    anchors = ("def condition(",)
    provides = (CaptureSet,)
    precedence = 60  # where a runner hands the draft's ids to the target, that hand-off decides
    reports = (Reports("draft-ids-ignored", hypothesis="config-ignored"),)

    VALID = (
        Example(
            files=_files(),
            target=LLAMA_8B_TARGET,
            draft={"architectures": ["LlamaForCausalLM"]},
            captured=("h2", "h16", "h29"),
            why="the builder's (2, L//2, L-3), captured at each layer's entry (id k is hk)",
        ),
        Example(
            files=_files(),
            target=LLAMA_8B_TARGET,
            draft={"architectures": ["LlamaForCausalLM"], "eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
            captured=("h2", "h16", "h29"),
            why="the draft declares the very ids the builder sets: nothing is ignored that matters",
        ),
        Example(
            files=_files(model=_FLAGGED_MODEL),
            target=LLAMA_8B_TARGET,
            draft={"architectures": ["LlamaForCausalLM"]},
            captured=("h2", "h16", "h29"),
            why="each chosen layer, asked by a flag, returns the stream entering it, kept by layer index",
        ),
    )
    INVALID = (
        Example(
            files=_files(),
            target=LLAMA_8B_TARGET,
            draft={
                "architectures": ["LlamaForCausalLM"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
            },
            captured=("h2", "h16", "h29"),
            finding="draft-ids-ignored",
            message=(
                "LlamaConfigBuilder sets the target's capture layers to (2, 16, 29) at "
                "engine/configurations/builder.py:38 whatever the draft declares; the draft config's "
                "eagle_config.eagle_aux_hidden_state_layer_ids [1, 15, 28] are never read for the capture"
            ),
            path="engine/configurations/builder.py",
            line=38,
            why="the engine chooses the layers; the draft's ids do not reach the target",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        built = build_config(ctx, "target")
        if built is None:
            return
        stores = [store for store in built.stores if ints(store.value)]
        if not stores:
            ctx.note(
                f"{built.builder.name} ({built.chosen.location}), the config builder {ctx.tree.label} picks for this "
                f"target, sets no layers to capture for an EAGLE-3 draft"
                + (f" (its build stopped at {built.raised})" if built.raised else "")
            )
            return
        store = stores[-1]  # the last assignment stands
        where = stored_step(ctx, store.value)
        cls = target_class(ctx)
        if cls is None or where is None:
            return
        ev = ctx.evaluator
        model = ev.new_object(cls, [], {"config": Val(ConfigObj(ctx.target.config))})
        try:
            holder = holder_of(ctx, model, store.attribute)
        except EvalRaise:
            holder = None
        if holder is None:
            ctx.note(
                f"{built.builder.name} sets {store.attribute} = {describe(store.value)} at {where.location}, but no "
                f"field of {cls.name} that holds it was found"
            )
            return
        owner, attribute = holder
        value = ev.field(owner, attribute)
        if not ints(value):
            return
        delivery = Step(
            where.location,
            f"{built.builder.name}.build sets the capture layers for spec_method={spec_method(ctx)!r}",
            where.code,
            StepKind.ASSIGN,
            where.patched,
        )
        yield from self._ignored(ctx, built.builder.name, store.value, where)
        yield CaptureSet(
            "serving",
            self.name,
            where.location,
            f"{owner.v.cls.name}.{attribute} = {describe(value)}",
            ids=store.value,
            ids_origin=IdsOrigin.DEFAULT if reads_draft(ctx, store.value) else IdsOrigin.ENGINE,
            owner=owner,
            attribute=attribute,
            value=value,
            delivery=delivery,
        )

    def _ignored(self, ctx: SideContext, builder: str, chosen: Val, where: Step) -> Iterator[Finding]:
        """The draft declares other ids than the builder sets: they never reach the target."""
        set_ids = ints(chosen) or []
        for keypath, declared in ctx.draft.declared_ids() if ctx.draft is not None else ():
            if isinstance(declared, list) and declared != set_ids and not reads_draft(ctx, chosen):
                yield self.finding(
                    ctx,
                    "draft-ids-ignored",
                    f"{builder} sets the target's capture layers to {tuple(set_ids)} at {where.location} whatever "
                    f"the draft declares; the draft config's {'.'.join(keypath)} {declared} are never read for "
                    f"the capture",
                    where.location,
                    likelihood_ratio=20.0,
                    steps=(where,),
                    fix=(
                        f"serve the draft on an engine that reads its ids, or edit {where.location} to capture the "
                        f"layers the draft was trained on"
                    ),
                )
                return
