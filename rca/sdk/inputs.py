"""What the user hands rca, as analyzers read it: configs (with cited keys), checkpoints and draft
weights, training dumps, launch settings and chat templates. Every value read carries where it
was read, so a finding can cite it."""

from rca.inputs.checkpoint import Checkpoint
from rca.inputs.configs import ConfigFile, ConfigKey, DraftConfig, KeyPath, declared_layers
from rca.inputs.draft import weights_directory
from rca.inputs.draftweights import DraftTensor, DraftWeights
from rca.inputs.dumps import DumpSet, TokenRecord, open_dumps, read_dump_metadata, token_records
from rca.inputs.launch import Setting, named_file
from rca.inputs.provenance import draft_families
from rca.inputs.templates import (
    ASSISTANT,
    TEMPLATE_FILE,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    USER,
    ChatTemplate,
    conversation,
    load_tokenizer,
    target_template,
    template_file,
)
from rca.inputs.vocabulary import TokenIds, tokenizer_ids
from rca.knowledge import quantized_exports

__all__ = [
    "ASSISTANT",
    "TEMPLATE_FILE",
    "TOKENIZER_CONFIG",
    "TOKENIZER_FILE",
    "USER",
    "ChatTemplate",
    "Checkpoint",
    "ConfigFile",
    "ConfigKey",
    "DraftConfig",
    "DraftTensor",
    "DraftWeights",
    "DumpSet",
    "KeyPath",
    "Setting",
    "TokenIds",
    "TokenRecord",
    "conversation",
    "declared_layers",
    "draft_families",
    "load_tokenizer",
    "named_file",
    "open_dumps",
    "quantized_exports",
    "read_dump_metadata",
    "target_template",
    "template_file",
    "token_records",
    "tokenizer_ids",
    "weights_directory",
]
