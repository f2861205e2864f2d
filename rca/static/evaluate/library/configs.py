"""HF-style configs read from config.json: attribute and key reads that cite the key's line, missing
keys as graph nodes of their own, sub-configs, and the draft's config reached through the unknown
objects engines hold it in (`draft_model_config.hf_config`, `config.eagle_config`)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from rca.errors import InputError
from rca.inputs.configs import TEXT_CONFIG_KEYS, ConfigFile, TargetConfig
from rca.knowledge import engines
from rca.model import StepKind
from rca.static.evaluate.interface import Frame, Interpreter, raised
from rca.static.evaluate.values import NO_SRC, BuiltinFn, ConfigObj, MutDict, Opaque, Val, python_to_val
from rca.static.graph import NodeKey

SUB_CONFIGS = frozenset({*TEXT_CONFIG_KEYS, "vision_config", "audio_config"})

# Engine objects that describe the draft model: their `.hf_config` is the draft's config.json
# (knowledge/engines, `draft_config_holders`).
DRAFT_MODEL_CONFIGS = frozenset(name for engine in engines().values() for name in engine.draft_config_holders)

# Draft-config keys that, read from an unknown config-like object, mean the draft's config.
DRAFT_KEYS = frozenset(
    {
        "eagle_config",
        "eagle_aux_hidden_state_layer_ids",
        "num_aux_hidden_states",
        "target_hidden_size",
    }
)


def attribute(
    ev: Interpreter,
    owner: Val,
    name: str,
    frame: Frame | None,
    node: cst.CSTNode | None,
    default: Val | None,
    missing_raises: bool = False,
    kind: str = "AttributeError",
) -> Val:
    """`config.name`: the key's value (a sub-config stays a config), or the default, an exception
    or an unknown value when the key is missing, each citing the missing key."""
    config: ConfigObj = owner.v
    assigned = ev.config_fields.get((id(config.file), config.path), {}).get(name)
    if assigned is not None:
        return assigned.with_src(owner.src)
    data = config.data
    path = (*config.path, name)
    if isinstance(data, dict) and name in data:
        key = key_node(ev, config, path)
        src = frozenset({key}) | owner.src
        value = data[name]
        if isinstance(value, dict):
            if name in SUB_CONFIGS:
                return Val(ConfigObj(config.file, path), src)
            inner = {k: python_to_val(v, frozenset({key_node(ev, config, (*path, k))})) for k, v in value.items()}
            return Val(MutDict(inner, config=(config.file, path)), src)
        if isinstance(value, list):  # one list object per key, so that items written into it stay
            shared = ev.config_lists.get((id(config.file), path))
            if shared is None:
                shared = ev.config_lists[(id(config.file), path)] = python_to_val(value, src).v
            return Val(shared, src)
        return python_to_val(value, src)
    if name in ("get_text_config", "to_dict", "to_diff_dict"):
        return Val(BuiltinFn(f"config.{name}", owner))
    missing = missing_node(ev, config.file, path)
    if default is not None:
        return default.with_src(frozenset({missing}))
    if missing_raises:
        raise raised(
            kind, f"{'.'.join(map(str, path))} is not in {config.file.display}", ev, frame, node, frozenset({missing})
        )
    return Val(
        Opaque(
            name, f"config.{name}", f"{name} is not in {config.file.display}; the config class may define a default"
        ),
        frozenset({missing}),
    )


def key_node(ev: Interpreter, config: ConfigObj, path: tuple) -> NodeKey:
    """The dataflow node of one config key, showing its value (`eagle_config.ids = [2, 30, 58]`)."""
    location = config.file.location(path)
    key = ev.graph.node(
        StepKind.CONFIG, location, f"{'.'.join(map(str, path))} =", config.file.doc.source_line(location.line), path
    )
    found, value = config.file.lookup(path)
    if found:
        shown = repr(value)
        ev.graph.observe(key, shown if len(shown) <= 60 else "{...}" if isinstance(value, dict) else shown[:57] + "...")
    return key


def missing_node(ev: Interpreter, file: ConfigFile, path: tuple) -> NodeKey:
    """The dataflow node of a key a config does not have, at the nearest place it would be."""
    location = file.location(path)
    return ev.graph.node(
        StepKind.CONFIG_MISSING,
        location,
        f"{'.'.join(map(str, path))} is not in {file.display}",
        file.doc.source_line(location.line),
        path,
    )


def has_attribute(ev: Interpreter, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
    """`hasattr(config, name)`, citing the key or its absence."""
    data = owner.v.data
    if name in ev.config_fields.get((id(owner.v.file), owner.v.path), {}) or (isinstance(data, dict) and name in data):
        return Val(True, attribute(ev, owner, name, frame, node, None).src)
    return Val(False, frozenset({missing_node(ev, owner.v.file, (*owner.v.path, name))}))


def subscript(
    ev: Interpreter, owner: Val, index: Any, src: frozenset[NodeKey], frame: Frame | None, node: cst.CSTNode | None
) -> Val | None:
    """`config["key"]`, and `None["key"]` where the None came from a missing key (the key the
    code then asked for is missing too); None for other payloads."""
    payload = owner.v
    if payload is None and not owner.src:
        # A parameter's None default in a function entered on its own (a forward pass whose caches
        # the analysis does not hand it): what the caller passes at runtime is not known.
        return Val(Opaque("item", "", "subscript of an argument not handed"), src)
    if payload is None:
        parent = ev.graph.nearest(owner.src, StepKind.CONFIG_MISSING)
        config = ev.draft if parent is not None and parent.location.input == "draft" else ev.target
        if parent is not None and config is not None and isinstance(index, str):
            path = ev.graph.g.nodes[parent]["keypath"] + (index,)
            src = src | {missing_node(ev, config, path)}
        raise raised("TypeError", "'NoneType' object is not subscriptable", ev, frame, node, src)
    if isinstance(payload, ConfigObj) and isinstance(index, str):
        return attribute(ev, owner, index, frame, node, default=None, missing_raises=True, kind="KeyError")
    return None


def call_method(receiver: Val, method: str) -> Val:
    """`config.get_text_config()`, `config.to_dict()`."""
    config: ConfigObj = receiver.v
    if method == "get_text_config":
        for nest in TEXT_CONFIG_KEYS:
            if isinstance(config.data, dict) and isinstance(config.data.get(nest), dict):
                return Val(ConfigObj(config.file, (*config.path, nest)), receiver.src)
        return receiver
    return python_to_val(config.data, receiver.src)


def config_like(opaque: Opaque) -> bool:
    """An unknown object that is a model's HF config (`draft_model_config.hf_config`, `config`)."""
    name = opaque.hint.lower()
    return name in ("config", "draft_config", "hf_config") or name.endswith(("hf_config", "model_config"))


def reads_draft_config(ev: Interpreter, opaque: Opaque, name: str) -> bool:
    """`<unknown HF config>.<draft key>`: a read of the draft's config.json."""
    return name in DRAFT_KEYS and ev.draft is not None and config_like(opaque)


def unknown_object_attribute(
    ev: Interpreter, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None
) -> Val | None:
    """An attribute of an unknown object that is the draft's config: `draft_model_config.hf_config`,
    or a draft key read from a config-like object. None for any other attribute."""
    opaque: Opaque = owner.v
    if name == "hf_config" and opaque.hint in DRAFT_MODEL_CONFIGS and ev.draft is not None:
        whole = ev.graph.node(StepKind.CONFIG, ev.draft.location(()), f"the draft's {ev.draft.display}", "", ())
        return Val(ConfigObj(ev.draft), owner.src | {whole})
    if reads_draft_config(ev, opaque, name):
        assert ev.draft is not None
        return attribute(ev, Val(ConfigObj(ev.draft)), name, frame, node, default=None, missing_raises=True)
    return None


def auto_config(
    ev: Interpreter,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
    src: frozenset,
) -> Val | None:
    """`AutoConfig.from_pretrained(...)`: the target model's config."""
    if ev.target is None:
        return None
    key = ev.call_node(
        frame,
        node,
        src | frozenset({ev.graph.node(StepKind.CONFIG, ev.target.location(()), f"target config {ev.target.display}")}),
        "loads the target model's config",
    )
    return Val(ConfigObj(ev.target), key)


def layer_count_node(ev: Interpreter) -> frozenset[NodeKey]:
    """The target config's layer count, as the source of how many states transformers returns."""
    if ev.target is None:
        return NO_SRC
    target = TargetConfig(ev.target)
    try:
        path = target.num_layers_path
    except InputError:
        return NO_SRC
    return frozenset(
        {ev.graph.from_step(StepKind.CONFIG, ev.target.step(path, f"{'.'.join(path)} = {target.num_layers}"), path)}
    )
