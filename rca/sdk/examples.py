"""Example sources and configs the analyzers' VALID and INVALID examples share: small trees in the
shape of real framework code (written for these examples, never copied from a release)."""

from __future__ import annotations

# A Llama-3.1-8B-shaped target, and a small one for trees whose model class is `Model`.
LLAMA_8B_TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}
SMALL_TARGET = {"architectures": ["Model"], "num_hidden_layers": 8, "hidden_size": 64}
DRAFT_IDS_0_3_5 = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 5]}}

# -- a draft with a reduced vocabulary (8 of the target's 32 tokens), and an SGLang-shaped loader ------
SMALL_VOCAB_TARGET = {**SMALL_TARGET, "hidden_size": 4, "vocab_size": 32}
SMALL_VOCAB_DRAFT = {"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32, "draft_vocab_size": 8}
# The tokenizer.json of a target padded past its tokenizer (SMALL_VOCAB_TARGET's 32 rows): 24 token ids.
TOKENIZER_24 = {"model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(24)}}, "added_tokens": []}
DRAFT_LOADER = """
class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.lm_head = ParallelLMHead(config.draft_vocab_size, config.hidden_size)
        self.hot_token_id = None

    def get_hot_token_id(self):
        return self.hot_token_id

    def load_weights(self, weights):
        for name, loaded_weight in weights:
            if "d2t" in name:
                self.hot_token_id = loaded_weight + torch.arange(loaded_weight.shape[0])
            else:
                self.load_one(name, loaded_weight)
"""

# -- a draft module whose norm before fc is decided by a flag ({reads}: NORM_READ, or nothing) ---------
NORM_DRAFT = {"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32}
NORM_MODEL = """
class DraftModel(nn.Module):
    def __init__(self, config):
        eagle_config = getattr(config, "eagle_config", None) or dict()
        self.fc = nn.Linear(config.hidden_size * 3, config.hidden_size, bias=False){reads}


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = DraftModel(config)
"""
NORM_READ = """
        self.norm_before_fc = bool(eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False)))
        self.input_norm = RMSNorm(config.hidden_size * 3) if self.norm_before_fc else None"""

# -- a draft whose layer takes its rotary embedding and maximum positions from its config --------------
ROPE_LAYER = """
class DecoderLayer(nn.Module):
    def __init__(self, config):
        rope_scaling = getattr(config, "rope_scaling", None)
        max_position_embeddings = getattr(config, "max_position_embeddings", 8192)
        self.rotary_emb = get_rope(4, max_position=max_position_embeddings, rope_scaling=rope_scaling)


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.layer = DecoderLayer(config)
"""
CONTEXT_FLAG = """
def add_cli_args(parser):
    parser.add_argument("--max-model-len", type=int, default=None)
"""

# -- an engine's EAGLE proposer that shares the target's head with the draft under a test ({test}) ---
HEAD_WORKER = """
class EagleProposer:
    def load_model(self, target_language_model):
        if {test}:
            self.model.lm_head = target_language_model.lm_head
"""

# ... and one that shares the target's embedding with a single pipeline stage only (vLLM 0.9-0.33's shape)
EMBED_WORKER = """
class EagleProposer:
    def load_model(self, target_language_model):
        if get_pp_group().world_size == 1 and not self.model.has_own_embed_tokens:
            del self.model.model.embed_tokens
            self.model.model.embed_tokens = target_language_model.model.embed_tokens


def add_cli_args(parser):
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
"""


def d2t_offsets(targets) -> tuple[int, ...]:
    """The d2t of a draft whose token i is target token `targets[i]`: the offsets `target - i`."""
    return tuple(target - i for i, target in enumerate(targets))


# -- an SGLang-shaped runner and a model whose forward captures in a loop over its layers ------------


SGLANG_RUNNER = """
class ModelRunner:
    def init_aux_hidden_state_capture(self):
        self.model.set_eagle3_layers_to_capture(self.draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"])
"""

# {capture_before} / {capture_after}: where the loop takes its capture (CAPTURE_BEFORE, CAPTURE_AFTER).
LOOP_MODEL = """
class Model(nn.Module):
    def __init__(self, config):
        self.config = config
        self.layers = make_layers(config.num_hidden_layers)
        self.capture_at = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.capture_at = [i + 1 for i in layer_ids]

    def forward(self, input_ids, positions):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux = []
        for i in range(len(self.layers)):
            {capture_before}
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
            {capture_after}
        return hidden_states, aux
"""

CAPTURE_BEFORE = "if i in self.capture_at:\n                aux.append(hidden_states + residual)"
CAPTURE_AFTER = "if i + 1 in self.capture_at:\n                aux.append(hidden_states + residual)"

# -- a model whose capture hand-off falls back to default layers when called without ids ---------
DEFAULTS_MODEL = """
class Model(nn.Module):
    def __init__(self, config):
        self.config = config
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.layers_to_capture = []

    def forward(self, input_ids, positions):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux = []
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
        return hidden_states, aux

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.layers_to_capture = [val + 1 for val in layer_ids]
"""

# -- a speculators-0.4-shaped data generator and its vLLM worker extension -------------------------
_GENERATOR = """
from transformers import AutoConfig


class HiddenStatesGenerator:
    def __init__(self, model_path, layer_ids=None):
        config = AutoConfig.from_pretrained(model_path)
        num_layers = config.num_hidden_layers
        if layer_ids is None:
            self.layer_ids = [2, num_layers // 2, num_layers - 3, num_layers - 1]
        else:
            self.layer_ids = layer_ids
        self.executor = Executor()
        self._setup_capture()

    def _setup_capture(self):
        self.executor.collective_rpc("_setup_capture_worker", args=(self.layer_ids,))
"""

_WORKER = """
import types


def _patched_forward(self, input_ids, positions):
    hidden_states = self.embed_input_ids(input_ids)
    residual = None
    aux_hidden_states = []
    target_layers = self._extension._layer_ids
    for idx, layer in enumerate(self.layers):
        hidden_states, residual = layer(hidden_states=hidden_states, positions=positions, residual=residual)
        if idx in target_layers:
            aux_hidden_states.append((hidden_states + residual).clone())
    return aux_hidden_states


class WorkerExtension:
    def _setup_capture_worker(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        model = self.model_runner.model
        model._extension = self
        model.forward = types.MethodType(_patched_forward, model)
"""

DATA_GENERATOR_FILES = {"gen/generator.py": _GENERATOR, "gen/worker.py": _WORKER}
# speculators' dump reader in its shape: the captures but the last feed fc, the last is the verifier's.
DUMP_READER = """
import torch


def standardize(data):
    return {
        "hidden_states": torch.cat(data["hidden_states"][:-1], dim=-1),
        "input_ids": data["input_ids"],
        "verifier_last_hidden_states": data["hidden_states"][-1],
    }


class SampleDataset:
    def __init__(self, files, standardize_fn=standardize):
        self.standardize_fn = standardize_fn
"""

# -- an SGLang-shaped tree whose runner captures only for an EAGLE3 launch -------------------------
_RUNNER = """
class ModelRunner:
    def __init__(self, server_args):
        self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        self.use_aux = False
        if self.spec_algorithm.is_eagle3():
            self.use_aux = True

    def init_aux_hidden_state_capture(self):
        if self.use_aux:
            self.model.set_eagle3_layers_to_capture(None)
"""
_SPEC_INFO = """
from enum import Enum, auto


class SpeculativeAlgorithm(Enum):
    EAGLE = auto()
    EAGLE3 = auto()

    def is_eagle3(self):
        return self == SpeculativeAlgorithm.EAGLE3

    @classmethod
    def from_string(cls, name):
        return cls[name.upper()]
"""

_GATED_MODEL = """
class Model(nn.Module):
    def __init__(self, config):
        self.layers_to_capture = []

    def forward(self, input_ids, positions):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
        return hidden_states, aux_hidden_states


class ModelForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = Model(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.model.layers_to_capture = [2, 4, 6] if layer_ids is None else [i + 1 for i in layer_ids]
"""

_LOGITS = """
import torch


class LogitsProcessor(nn.Module):
    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None):
        if aux_hidden_states is not None:
            hidden_states_to_store = torch.cat(aux_hidden_states, dim=-1)
        else:
            hidden_states_to_store = hidden_states
        return hidden_states_to_store
"""

_GATED_DRAFT = """
import torch


class DraftModel(nn.Module):
    def __init__(self, config):
        self.fc = torch.nn.Linear(config.hidden_size * 3, config.hidden_size)

    def forward(self, input_ids, positions, forward_batch):
        embeds = self.embed_tokens(input_ids)
        hidden_states = forward_batch.spec_info.hidden_states
        if hidden_states.shape[-1] != embeds.shape[-1]:
            hidden_states = self.fc(hidden_states)
        return hidden_states


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = DraftModel(config)
"""

_SERVER_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--speculative-algorithm", type=str, choices=["EAGLE", "EAGLE3"])
"""

LAUNCH_GATED_FILES = {
    "srt/server_args.py": _SERVER_ARGS,
    "srt/model_runner.py": _RUNNER.replace(
        "class ModelRunner", "from .spec_info import SpeculativeAlgorithm\n\n\nclass ModelRunner"
    ),
    "srt/spec_info.py": _SPEC_INFO,
    "srt/models/model.py": _GATED_MODEL,
    "srt/logits_processor.py": _LOGITS,
    "srt/models/draft.py": _GATED_DRAFT,
}

LAUNCH_GATED_TARGET = {"architectures": ["ModelForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64}
LAUNCH_GATED_DRAFT = {"architectures": ["DraftForCausalLM"], "hidden_size": 64}


# -- a vLLM-shaped target split into pipeline stages: each stage loops over its own layers -----------
# {start}: how the loop numbers the stage's layers ("" from 0, ", start=self.start_layer" globally);
# {relay}: what an earlier stage hands on besides its hidden states ("" nothing, PP_RELAY its captures).
PP_FILES = {
    "runner.py": """
class ModelRunner:
    def load_model(self):
        self.model.set_aux_hidden_state_layers(self.draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"])
""",
    "utils.py": """
def get_pp_indices(num_hidden_layers, pp_rank, pp_size):
    per_stage = num_hidden_layers // pp_size
    start = pp_rank * per_stage
    end = start + per_stage if pp_rank < pp_size - 1 else num_hidden_layers
    return (start, end)


def add_cli_args(parser):
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
""",
}
PP_MODEL = """
from itertools import islice


class Model(nn.Module):
    def __init__(self, config):
        self.config = config
        self.start_layer, self.end_layer, self.layers = make_layers(config.num_hidden_layers)
        self.aux_layers = ()

    def set_aux_hidden_state_layers(self, layers):
        self.aux_layers = tuple(layers)

    def forward(self, input_ids, positions, intermediate_tensors=None):
        if get_pp_group().is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        else:
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        aux = []
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer){start}):
            hidden_states, residual = layer(positions, hidden_states, residual)
            if idx + 1 in self.aux_layers:
                aux.append(hidden_states + residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({{"hidden_states": hidden_states, "residual": residual{relay}}})
        return hidden_states, aux
"""
PP_RELAY = ', **{f"aux_{i}": t for i, t in enumerate(aux)}'


# -- an engine attention that falls back to the served model's window, and a draft layer that builds
# one ({passed}: "" or the per-layer window it hands on) ----------------------------------------------
WINDOW_ATTENTION = """
class Attention(nn.Module):
    def __init__(self, num_heads, head_size, scale, cache_config=None, per_layer_sliding_window: int | None = None):
        super().__init__()
        if per_layer_sliding_window is not None:
            sliding_window = per_layer_sliding_window
        elif cache_config is not None:
            sliding_window = cache_config.sliding_window
        else:
            sliding_window = None
        self.sliding_window = sliding_window
"""
WINDOW_LAYER = """
from attention import Attention


class DraftLayer(nn.Module):
    def __init__(self, config, cache_config=None):
        self.self_attn = Attention(
            config.num_attention_heads,
            4,
            0.5,
            cache_config=cache_config,{passed}
        )


class DraftModel(nn.Module):
    def __init__(self, config):
        self.layers = nn.ModuleList([DraftLayer(config) for _ in range(config.num_hidden_layers)])


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.config = config
        self.model = DraftModel(config)
"""
WINDOW_DRAFT = {
    "architectures": ["DraftForCausalLM"],
    "hidden_size": 4,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "layer_types": ["sliding_attention"],
    "sliding_window": 2048,
}
