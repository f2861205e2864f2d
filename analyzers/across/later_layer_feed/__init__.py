"""How each side's draft module feeds its decoder layers after the first, for a draft of two or more."""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import (
    Analyzer,
    Compares,
    ConfigEdit,
    Establishes,
    Example,
    Fact,
    Finding,
    Reports,
    SideContext,
    StepKind,
    Wiring,
)
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.sides import trainer_draft_module

from .layers import LayerFeed, LayerReader, declared_layers

# -- example trees, in the shape of the real designs (written for these examples) -------------------

# every layer concatenates [embeds, hidden] (SpecForge's multi-layer pull request #401, before review)
_EVERY_LAYER_TRAINER = """
import torch
from torch import nn


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size * 2, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size)
        self.input_layernorm = nn.RMSNorm(config.hidden_size)

    def forward(self, input_emb, hidden_states):
        residual = hidden_states
        hidden_states = self.hidden_norm(hidden_states)
        input_emb = self.input_layernorm(input_emb)
        hidden_states = torch.cat((input_emb, hidden_states), dim=-1)
        return residual + self.q_proj(hidden_states)


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.hidden_size * 3, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, inputs_embeds):
        hidden_states = self.fc(hidden_states)
        for layer in self.layers:
            hidden_states = layer(input_emb=inputs_embeds, hidden_states=hidden_states)
        return hidden_states
"""

# one layer, whatever the config declares (SpecForge 0.1 and 0.2)
_ONE_LAYER_TRAINER = """
import torch
from torch import nn


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size * 2, config.hidden_size, bias=False)

    def forward(self, input_emb, hidden_states):
        return hidden_states + self.q_proj(torch.cat((input_emb, hidden_states), dim=-1))


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.midlayer = LlamaDecoderLayer(config)

    def forward(self, hidden_states, inputs_embeds):
        return self.midlayer(input_emb=inputs_embeds, hidden_states=hidden_states)
"""

# [embeds, hidden] concatenated once, before the layers: the first splits it, the others take the
# previous layer's output (speculators)
_FIRST_LAYER_TRAINER = """
import torch
from torch import nn


class Eagle3FirstLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.q_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        embeds, hidden = hidden_states.chunk(2, dim=-1)
        return hidden + self.q_proj(hidden_states)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        return hidden_states + self.q_proj(hidden_states)


class Eagle3DraftModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        num_layers = config.num_hidden_layers
        layers = [Eagle3FirstLayer(config, layer_idx=0)]
        layers.extend([DecoderLayer(config, layer_idx) for layer_idx in range(1, num_layers)])
        self.layers = nn.ModuleList(layers)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.fc = nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)

    def forward(self, input_ids, hidden_states):
        input_embeds = self.embed_tokens(input_ids)
        hidden_states = torch.cat([input_embeds, hidden_states], dim=-1)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states)
        return self.lm_head(hidden_states)
"""

# an engine whose first layer takes [embeds, hidden] and the others the hidden state (vLLM 0.11.1+,
# SGLang 0.5.12+)
_ENGINE = """
import torch
from torch import nn


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        qkv_input_size = 2 * config.hidden_size if layer_idx == 0 else config.hidden_size
        self.qkv_proj = nn.Linear(qkv_input_size, 3 * config.hidden_size, bias=False)
        self.input_layernorm = nn.RMSNorm(config.hidden_size)
        self.hidden_norm = nn.RMSNorm(config.hidden_size)
        self.layer_idx = layer_idx

    def forward(self, positions, embeds, hidden_states, residual):
        if self.layer_idx == 0:
            embeds = self.input_layernorm(embeds)
            residual = hidden_states
            hidden_states = torch.cat([embeds, self.hidden_norm(hidden_states)], dim=-1)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        return self.qkv_proj(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config, layer_idx=layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )

    def forward(self, input_ids, positions, hidden_states):
        input_embeds = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(
                positions=positions, embeds=input_embeds, hidden_states=hidden_states, residual=residual
            )
        return hidden_states


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LlamaModel(config)
"""

# an engine that builds one layer whatever the config declares (vLLM 0.9, 0.11.0)
_ONE_LAYER_ENGINE = """
import torch
from torch import nn


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv_proj = nn.Linear(2 * config.hidden_size, 3 * config.hidden_size, bias=False)

    def forward(self, positions, embeds, hidden_states):
        return self.qkv_proj(torch.cat([embeds, hidden_states], dim=-1))


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config)])

    def forward(self, input_ids, positions, hidden_states):
        input_embeds = self.embed_tokens(input_ids)
        return self.layers[0](positions, input_embeds, hidden_states)


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LlamaModel(config)
"""

# an engine that refuses a draft of more than one layer (SGLang up to 0.5.10, lmdeploy)
_REFUSING_ENGINE = """
from torch import nn


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        if self.config.num_hidden_layers != 1:
            raise ValueError("EAGLE3 currently only supports 1 layer")
        self.midlayer = nn.Linear(2 * config.hidden_size, config.hidden_size)
"""

_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "num_hidden_layers": 2,
}
_TRAINER_FILE = "modeling/draft/llama3_eagle.py"
_ENGINE_FILE = "models/llama_eagle3.py"


class LaterLayerFeed(Analyzer):
    """Reads how the draft module of each side feeds its decoder layers after the first, and compares the two.

    ## What it reads
    Only for a draft config that declares two or more decoder layers (`num_hidden_layers`, or
    speculators' `transformer_layer_config.num_hidden_layers`): a one-layer draft is never read.
    On each side, the draft class built for the draft's `architectures` (the trainer's EAGLE-3
    module where the config names none of its classes), evaluated with the draft's config, and
    the module holding its layers (the class itself or its `model`). A constructor that raises on
    the count refuses the draft; one that builds a single layer (`self.midlayer = ...`, or a list
    of one) whatever the count says builds one. Otherwise the method that runs the layers says how
    they are fed: `[embeds, hidden]` concatenated inside the loop (every layer takes it), once
    before the loop with each layer's output passed to the next (only the first takes it), or
    the embeddings handed to every layer, where the layer's own `forward`, read down the branch
    its evaluated fields select (`self.layer_idx == 0`, `self.is_input_layer`), concatenates them
    or not.

    ## Why it matters
    Multi-layer EAGLE-3 drafts come in two designs: every layer after the first takes the hidden
    state alone (vLLM from 0.11.1, SGLang from 0.5.12, speculators), or takes `[embeds, hidden]`
    as the first does (SGLang's and SpecForge's first multi-layer proposals). And SpecForge 0.1
    and 0.2 build one layer whatever `num_hidden_layers` says, so a config that declares two
    describes a one-layer draft. Served by an engine that builds the declared count, its later
    layers were never trained: SGLang and vLLM load an EAGLE-3 draft without checking that every
    weight was loaded, so they run with no error and acceptance falls. A later layer trained on
    another input than the engine gives it has another width too: where the engine's loader
    checks shapes, the checkpoint fails to load rather than drafting poorly.
    """

    code = "RCA-X104"
    name = "later-layer-feed"
    formerly = ("RCA-T112",)
    sides = frozenset({"serving", "training"})
    # no anchors: the files it reads are the draft's module, found by the draft's architectures
    establishes = Establishes(
        "draft_layers", "how the side's draft module builds and feeds its decoder layers after the first"
    )
    compares = Compares(
        training="how the trainer's draft module feeds its layers after the first",
        serving="how the engine's draft module feeds them",
    )
    reports = (
        Reports("later-layers-fed-differently", hypothesis="later-layers-wired-differently"),
        Reports("later-layers-never-trained", hypothesis="later-layers-wired-differently"),
        Reports("later-layers-never-served", hypothesis="later-layers-wired-differently"),
    )
    VALID = (
        Example(
            files={"speculators/models/eagle3/core.py": _FIRST_LAYER_TRAINER},
            serving_files={_ENGINE_FILE: _ENGINE},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            why="a two-layer draft whose second layer takes the hidden state alone on both sides",
        ),
        Example(
            files={_TRAINER_FILE: _ONE_LAYER_TRAINER},
            serving_files={_ENGINE_FILE: _ONE_LAYER_ENGINE},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            why="both sides build one layer whatever the config declares: the draft runs as it was trained",
        ),
        Example(
            files={_TRAINER_FILE: _EVERY_LAYER_TRAINER},
            serving_files={_ENGINE_FILE: _REFUSING_ENGINE},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            why="an engine that refuses a two-layer draft fails at launch: a note, not a cause of low acceptance",
        ),
    )
    INVALID = (
        Example(
            files={_TRAINER_FILE: _EVERY_LAYER_TRAINER},
            serving_files={_ENGINE_FILE: _ENGINE},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            finding="later-layers-fed-differently",
            path=_TRAINER_FILE,
            line=25,
            message=(
                "num_hidden_layers = 2: in training, LlamaForCausalLMEagle3.layers feeds each layer after the first "
                "[embeds, hidden], as the first layer does; served, LlamaModel.layers feeds it the previous layer's "
                "hidden state only: those layers were trained on inputs the engine never gives them"
            ),
            why="a draft whose every layer concatenated the embeddings, served by an engine that gives layers "
            "after the first the hidden state alone",
        ),
        Example(
            files={_TRAINER_FILE: _ONE_LAYER_TRAINER},
            serving_files={_ENGINE_FILE: _ENGINE},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            finding="later-layers-never-trained",
            path=_TRAINER_FILE,
            line=18,
            message=(
                "num_hidden_layers = 2: in training, LlamaForCausalLMEagle3.midlayer is the only decoder layer built; "
                "served, LlamaModel.layers builds 2 and runs each after the first on the previous layer's hidden state "
                "only: those layers were never trained, and the checkpoint has no weights for them"
            ),
            why="a config declaring two layers for a trainer that builds one: the engine runs a second, untrained "
            "layer",
        ),
        Example(
            files={"speculators/models/eagle3/core.py": _FIRST_LAYER_TRAINER},
            serving_files={_ENGINE_FILE: _ONE_LAYER_ENGINE},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            finding="later-layers-never-served",
            path="speculators/models/eagle3/core.py",
            line=32,
            message=(
                "num_hidden_layers = 2: in training, Eagle3DraftModel.layers runs 2 layers, each after the first on "
                "the previous layer's hidden state only; served, LlamaModel.layers is the only decoder layer built: "
                "the trained layers after the first never run"
            ),
            why="a two-layer draft served by an engine release that builds one layer",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        declared = declared_layers(ctx.declared_draft)
        if declared is None or declared[0] < 2:
            return  # a one-layer draft (or one that declares no count): nothing to compare
        count, key, config = declared
        built = ctx.draft_model() or (trainer_draft_module(ctx) if ctx.side == "training" else None)
        if built is None:
            ctx.note(f"how the draft's {count} decoder layers are fed was not read: its module was not found")
            return
        feed = LayerReader(ctx, built[0], built[1], count, key, config).read()
        if feed is None:
            return
        if feed.feed == LayerFeed.REFUSED:
            ctx.note(
                f"{built[0].name} refuses a draft of {count} decoder layers ({feed.steps[1].location}): "
                "it fails at launch rather than drafting poorly"
            )
        yield self.aspect(ctx, feed.steps[1].location, feed.describe(), feed)

    def across(self, training: Wiring, serving: Wiring) -> Iterator[Finding]:
        trained, served = self.established(training), self.established(serving)
        if trained is None or served is None or trained.feed == served.feed:
            return
        if LayerFeed.REFUSED in (trained.feed, served.feed):
            return  # a side that refuses the draft fails loudly: nothing trained was served otherwise
        config = next((step for step in trained.steps if step.kind == StepKind.CONFIG), None)
        steps = (
            *((config,) if config is not None else ()),
            *(step for step in (*trained.steps, *served.steps) if step.kind != StepKind.CONFIG),
        )
        where = next(step for step in trained.steps if step.kind != StepKind.CONFIG).location  # the trainer's code
        said = f"{'.'.join(trained.key)} = {trained.declared}"
        edit = None
        if trained.stacked and served.stacked:
            name = "later-layers-fed-differently"
            what = (
                f"in training, {trained.holder} feeds each layer after the first {trained.later}; served, "
                f"{served.holder} feeds it {served.later}: those layers were trained on inputs the engine never "
                "gives them"
            )
            fix = (
                f"serve on an engine release whose draft module feeds layers after the first {trained.later_short}, "
                f"as {trained.holder} did in training, or retrain the draft with {served.later_short} there, as "
                f"{served.holder} runs it"
            )
        elif served.stacked:
            name = "later-layers-never-trained"
            what = (
                f"in training, {trained.holder} is the only decoder layer built; served, "
                f"{served.holder} builds {served.declared} and runs each after the first on {served.later}: those "
                "layers were never trained, and the checkpoint has no weights for them"
            )
            at = f" ({config.location})" if config is not None else ""
            fix = (
                f"set {'.'.join(trained.key)} to 1 in the draft config{at}: the draft was trained as one layer, "
                "which the engine then builds alone"
            )
            edit = ConfigEdit(trained.key, 1)
        else:
            name = "later-layers-never-served"
            what = (
                f"in training, {trained.holder} runs {trained.declared} layers, each after the first on "
                f"{trained.later}; served, {served.holder} is the only decoder layer built: the trained layers after "
                "the first never run"
            )
            fix = (
                f"serve on an engine release that builds {'.'.join(trained.key)} decoder layers and feeds those "
                f"after the first {trained.later_short}, as training did"
            )
        yield self.finding(
            "training", name, f"{said}: {what}", where, likelihood_ratio=10.0, steps=steps, fix=fix, edit=edit
        )
