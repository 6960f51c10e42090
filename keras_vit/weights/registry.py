"""The registry of ViT checkpoints: names, files and the model each one needs.

Each `WeightsEntry` names one released file (`url`), the `keras_vit.ViT` arguments that
hold it, its label set and pretraining data, its preprocessing, and the ImageNet top-1
its release reports. Names follow timm (`{architecture}_{resolution}.{tag}`); where timm
has the same tag the entry is timm's file. The entries are the families' (each module of
`keras_vit.families` lists its own, with its sources); `register_weights` adds others.
"""

import fnmatch

from keras_vit.families import FAMILIES
from keras_vit.families.family import (  # noqa: F401 (this module's names since the first release)
    IMAGENET1K_CLASSES,
    IMAGENET21K_CLASSES,
    OFFICIAL_BASE,
    TIMM_HUB,
    WeightsEntry,
)
from keras_vit.families.vit import AugRegName, parse_augreg_name  # noqa: F401 (likewise)
from keras_vit.models.variants import parse_variant

_REGISTRY = {}


def register_weights(entry, *, replace=False):
    """Adds a `WeightsEntry` to the registry (e.g. a mirror's own checkpoints).

    A name already registered with other contents is a `ValueError` unless
    `replace=True`.

    Example:

    >>> entry = WeightsEntry("my_vit.demo", "https://example.com/my_vit.npz", None, 32,
    ...                      10, model_args=dict(patch_size=8, hidden_dim=32,
    ...                      num_layers=2, num_heads=4, mlp_dim=64))
    >>> register_weights(entry).name
    'my_vit.demo'
    """
    if not isinstance(entry, WeightsEntry):
        raise ValueError(f"register_weights expects a WeightsEntry, got {type(entry).__name__}.")
    if entry.variant is not None:
        parse_variant(entry.variant)
    old = _REGISTRY.get(entry.name)
    if old is not None and old != entry and not replace:
        raise ValueError(
            f"Weights {entry.name!r} are already registered with other contents "
            f"({old.url}); pass replace=True to replace them."
        )
    _REGISTRY[entry.name] = entry
    return entry


def list_weights(pattern=None):
    """The registered checkpoints whose names match `pattern`, sorted by name.

    `pattern` is a shell-style pattern (`"vit_base_*"`, `"*augreg*in1k"`), a variant
    (`"B/16"`) or, without `*`, `?` or `[`, a part of the name; case is ignored.

    Example:

    >>> [e.name for e in list_weights("vit_base_patch16_384.augreg_in21k_ft_in1k")]
    ['vit_base_patch16_384.augreg_in21k_ft_in1k']
    >>> list_weights("vit_tiny_patch16_384.augreg_recommended_in21k_ft_in1k")[0].top1
    78.22
    """
    entries = sorted(_REGISTRY.values(), key=lambda e: e.name)
    if not pattern:
        return entries
    variant = pattern.lower()
    pattern = variant if any(c in variant for c in "*?[") else f"*{variant}*"
    return [
        e for e in entries
        if fnmatch.fnmatchcase(e.name.lower(), pattern) or (e.variant or "").lower() == variant
    ]


def get_weights(name):
    """The entry registered under `name`; an unknown name is a `ValueError` naming close ones.

    Example:

    >>> get_weights("vit_base_patch16_224.orig_in21k").num_classes
    21843
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    import difflib

    close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see keras-vit weights"
    raise ValueError(f"Unknown weights {name!r}: {hint} (keras_vit.list_weights() lists them).")


def is_registered(name):
    """Whether `name` is a registry name."""
    return isinstance(name, str) and name in _REGISTRY


LABEL_SETS = ("imagenet1k", "imagenet21k")


def class_names(label_set):
    """The class names of a bundled label set, in the checkpoints' class order.

    `"imagenet1k"` is the standard ILSVRC-2012 order, `"imagenet21k"` Google's 21843
    classes (the order of the in21k heads); each name is the class's WordNet lemmas,
    as timm's `ImageNetInfo` gives them.

    Example:

    >>> names = class_names("imagenet1k")
    >>> len(names), names[0], names[207]
    (1000, 'tench, Tinca tinca', 'golden retriever')
    """
    if label_set not in LABEL_SETS:
        raise ValueError(f"Unknown label set {label_set!r}: expected one of {', '.join(LABEL_SETS)}.")
    from importlib import resources

    text = resources.files("keras_vit.weights").joinpath(f"labels/{label_set}.txt").read_text("utf-8")
    return text.splitlines()


for _family in FAMILIES:
    for _entry in _family.entries:
        register_weights(_entry)
