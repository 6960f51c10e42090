"""The small types a family module fills in: `Family`, its checkpoints' `WeightsEntry`
and its checkpoint key renames (`TorchName`).

A family (the paper's ViT, DeiT, DINOv2, SigLIP, CLIP, EVA-02, ...) is one module of
`keras_vit.families` that defines `FAMILY`, a `Family`: the `keras_vit.ViT` switches
its models are built with, its registry entries and their preprocessing, how its HF
transformers configs and timm files give the model's arguments, and how its HF and timm
tensor names map onto the official vit_jax layout. `keras_vit.weights` reads these and
knows no family by name.
"""

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from keras_vit.models.preprocessing import DEFAULT, check_preprocessing

OFFICIAL_BASE = "https://storage.googleapis.com/vit_models/"
# timm's copies of released checkpoints on the Hugging Face Hub, by timm name.
TIMM_HUB = "https://huggingface.co/timm/{name}/resolve/main/model.safetensors"
IMAGENET21K_CLASSES = 21843  # Google's ImageNet-21k ("goog" order, timm's imagenet21k_goog)
IMAGENET1K_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class WeightsEntry:
    """One checkpoint of the registry.

    Attributes:
        name: the registry name, e.g. `"vit_base_patch16_224.augreg_in21k_ft_in1k"`.
        url: where the file is released (`https://storage.googleapis.com/vit_models/...`).
        variant: the `keras_vit.ViT` variant (`"B/16"`, `"R50+L/32"`), or None when
            `model_args` describes a custom architecture.
        image_size: the resolution the checkpoint was trained (fine-tuned) at.
        num_classes: the width of its head.
        labels: the bundled label set of the head (`"imagenet1k"`, `"imagenet21k"`), or
            None.
        pretraining: the pretraining data, e.g. `"ImageNet-21k"`.
        finetuning: the fine-tuning data (`"ImageNet-1k"`), or None.
        top1: the ImageNet-1k top-1 accuracy (%) that the release reports, or None.
        size_mib: the file size the release lists (MiB), or None.
        sha256: the file's SHA-256 when known (a download, and a cached file that
            changed, are checked against it; without it, plain `http://` is refused).
        activation: `"softmax"` or `"sigmoid"` (the in21k heads were trained with the
            sigmoid cross-entropy).
        model_args: the other `keras_vit.ViT` arguments, e.g. `gelu_approximate=True`
            (the JAX checkpoints use the tanh GELU) and `representation_size`.
        size: the file's exact size in bytes when known (checked with `sha256`).
        mean, std: the per-channel pixel mean and std (in [0, 1] units) the checkpoint
            was trained with: 0.5 for the official ViT files (pixels in [-1, 1]),
            ImageNet's for DeiT (timm's `pretrained_cfg`).
        interpolation: the resize method of its evaluation, `"bilinear"` or `"bicubic"`.
        antialias: whether that resize antialiases (PIL's, as timm and HF resize) or not
            (TensorFlow's, as vit_jax and big_vision resize); None for the
            interpolation's own default (`keras_vit.models.preprocessing`).
        crop_fraction: the central crop of its evaluation (timm's `crop_pct`), or None
            for the whole image resized (vit_jax's evaluation).
    """

    name: str
    url: str
    variant: str | None
    image_size: int
    num_classes: int
    labels: str | None = None
    pretraining: str = "ImageNet-21k"
    finetuning: str | None = None
    top1: float | None = None
    size_mib: float | None = None
    sha256: str | None = None
    activation: str = "softmax"
    model_args: dict = dataclasses.field(default_factory=dict)
    size: int | None = None
    mean: tuple = tuple(DEFAULT["mean"])
    std: tuple = tuple(DEFAULT["std"])
    interpolation: str = DEFAULT["interpolation"]
    antialias: bool | None = None
    crop_fraction: float | None = DEFAULT["crop_fraction"]

    @property
    def preprocessing(self):
        """The checkpoint's preprocessing dict (`keras_vit.models.preprocessing`)."""
        return check_preprocessing(dict(
            mean=self.mean, std=self.std, interpolation=self.interpolation,
            crop_fraction=self.crop_fraction,
            **({} if self.antialias is None else {"antialias": self.antialias}),
        ))

    def build_args(self):
        """The keyword arguments of `keras_vit.ViT` that build this checkpoint's model
        (`preprocessing` only where it is not `DEFAULT`, so that those models' configs
        stay as they were)."""
        args = dict(image_size=self.image_size, num_classes=self.num_classes, **self.model_args)
        if self.variant is not None:
            args["variant"] = self.variant
        if self.preprocessing != DEFAULT:
            args["preprocessing"] = self.preprocessing
        return args

    @property
    def relative_path(self):
        """The file's path under the official bucket (or its URL's last part)."""
        if self.url.startswith(OFFICIAL_BASE):
            return self.url[len(OFFICIAL_BASE):]
        return self.url.rsplit("/", 1)[-1]


# The official layout's keys (the released vit_jax `.npz` files'): every format is read
# into them. Beyond vit_jax: big_vision's MAP head (SigLIP), CLIP's LayerNorm before the
# blocks and its projection to the image-text embedding, and EVA-02's LayerNorm before
# the MLP's last Dense, under each block's key.
POS_KEY = "Transformer/posembed_input/pos_embedding"
QKV = ("query", "key", "value")
BLOCK_KEY = "Transformer/encoderblock_{i}/"
ATTENTION_KEY = BLOCK_KEY + "MultiHeadDotProductAttention_1"
MAP_HEAD_KEY = "MAPHead_0"
MAP_ATTENTION_KEY = MAP_HEAD_KEY + "/MultiHeadDotProductAttention_0"
PRE_NORM_KEY = "pre_norm"
PROJECTION_KEY = "projection"
MLP_NORM_KEY = "MlpBlock_3/LayerNorm_0"

# How a PyTorch tensor becomes official ones (`keras_vit.weights.formats`): "copy" as it
# is, "scale" a layer scale, "token" / "rows" HF's class token and position table without
# their batch axis, "norm" a LayerNorm, "conv" the patch embedding, "dense" a Linear,
# "heads_in" / "heads_out" an attention projection split by heads, "qkv" / "kv" fused ones,
# "qkv_rotate_half" a fused q|k|v whose rope rotates each query and key channel with the
# one half a head away (`rotate_half`, DINOv3's): each head's q and k channels are read in
# `rotate_half_order`, the interleaved pairs keras-vit's attention rotates.
CONVERSIONS = ("copy", "scale", "token", "rows", "norm", "conv", "dense", "heads_in",
               "heads_out", "qkv", "kv", "qkv_rotate_half")
# The prefix of a block's index in HF transformers and timm names (group `i`).
HF_LAYER = r"encoder\.layer\.(?P<i>\d+)\."
TIMM_BLOCK = r"blocks\.(?P<i>\d+)\."


def rotate_half_order(head_dim):
    """The order of one head's channels that makes `rotate_half`'s pairs (each channel
    with the one `head_dim / 2` away) interleaved pairs: `(0, h/2, 1, h/2 + 1, ...)`.
    Reordering the queries and keys alike leaves every product of a query with a key,
    hence the attention, unchanged.

    Example:

    >>> rotate_half_order(8).tolist()
    [0, 4, 1, 5, 2, 6, 3, 7]
    """
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=-1).reshape(-1)


@dataclasses.dataclass(frozen=True)
class TorchName:
    """Where one tensor of an HF transformers or timm state dict goes in the official
    layout.

    Attributes:
        target: the official key (format fields such as `{i}` and `{name}` are filled
            from the pattern's named groups); a LayerNorm's or Linear's, without its
            `/scale`, `/kernel` or `/bias`.
        kind: its conversion, one of `CONVERSIONS`.
        hf: the HF transformers name as a regular expression (after the renames of
            `Family.hf_renames`), or None where that format has no such tensor; the
            reader adds `.weight` / `.bias` except to "copy", "scale", "token" and "rows".
        timm: the timm name, likewise.
    """

    target: str
    kind: str
    hf: str | None
    timm: str | None

    def __post_init__(self):
        if self.kind not in CONVERSIONS:
            raise ValueError(
                f"TorchName kind must be one of {', '.join(CONVERSIONS)}, got {self.kind!r}."
            )


@dataclasses.dataclass(frozen=True)
class Family:
    """All a family of checkpoints knows, as `keras_vit.weights` reads it.

    Attributes:
        name: the family's name, its module's (`"deit"`).
        switches: the `keras_vit.ViT` keyword arguments its models are built with, by a
            name of each kind of model (`{"deit3": dict(no_embed_class=True, ...)}`);
            the arguments the paper's ViT leaves at their defaults.
        entries: its registry checkpoints (`WeightsEntry`), preprocessing included.
        hf_architectures: the HF transformers `architectures[0]` it builds, each with
            the `keras_vit.ViT` switches it fixes.
        hf_model_types: the `model_type` a config.json writes beside those
            architectures, by the architecture's leading name (`{"Dinov2": ("dinov2",)}`;
            the longest leading name that fits decides).
        hf_config_defaults: what its config class defaults to where `config.json`
            leaves a key out (`layer_norm_eps`, `hidden_act`, ...).
        hf_arguments: `(config, top, architecture) -> dict`, the `keras_vit.ViT`
            arguments its config gives beyond the generic ones (sizes, epsilon, GELU,
            classes): `config` is the vision config with `hf_config_defaults` filled in,
            `top` the whole config.json. None: none.
        hf_pools: whether its `*Model` pools the tokens with no `pooler` tensor
            (DINOv2's class token, SigLIP's MAP head); otherwise a `*Model` without a
            pooler outputs the tokens (`pooling=False`).
        hf_prefixes: the module names HF prepends to its tensors in a file
            (`"dinov2"` in `dinov2.embeddings...`), removed before the renames.
        hf_renames: `(pattern, replacement)` regular-expression substitutions applied
            in order to every HF name, giving the names of `torch_names`; each must match
            this family's names only, as every family's renames run on every key.
        torch_names: the `TorchName` of each tensor it adds to the official layout.
        timm_layout: `(arrays, notes) -> dict`, which rewrites a timm state dict in
            place into the names of `torch_names` (appending to `notes` what it adapted)
            and returns the `keras_vit.ViT` arguments the file was trained with that no
            tensor shows (EVA-02's rope); None: none.
        hf_layout: `(arrays, notes) -> dict`, the same for an HF state dict, before the
            renames (DINOv3's separate q, k, v and gated MLP, fused); None: none.
        timm_arguments: `(architecture, model_args) -> dict | None`, the `keras_vit.ViT`
            arguments of a timm model folder's `config.json` (its `architecture` and the
            `model_args` it was created with), or None for an architecture not of this
            family; None: its timm folders are built from their registry entry alone.

    Example:

    >>> from keras_vit.families import FAMILIES
    >>> deit = next(family for family in FAMILIES if family.name == "deit")
    >>> deit.switches["deit3"], deit.hf_architectures["DeiTForImageClassificationWithTeacher"]
    ({'no_embed_class': True, 'layer_scale_init': 1e-06}, {'distilled': True})
    """

    name: str
    switches: Mapping[str, dict] = dataclasses.field(default_factory=dict)
    entries: tuple = ()
    hf_architectures: Mapping[str, dict] = dataclasses.field(default_factory=dict)
    hf_model_types: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    hf_config_defaults: Mapping[str, object] = dataclasses.field(default_factory=dict)
    hf_arguments: Callable[[dict, dict, str], dict] | None = None
    hf_pools: bool = False
    hf_prefixes: tuple = ()
    hf_renames: tuple = ()
    torch_names: tuple = ()
    timm_layout: Callable[[dict, list], dict] | None = None
    hf_layout: Callable[[dict, list], dict] | None = None
    timm_arguments: Callable[[str, dict], dict | None] | None = None
