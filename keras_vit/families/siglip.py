"""SigLIP and SigLIP 2's image tower: timm's copies of Google's release, HF
transformers' `SiglipVisionModel` and `SiglipModel`, big_vision's and timm's names.

Registry sources: `webli`, `v2_webli` (SigLIP, SigLIP 2): the image towers of Google's
release (`google/siglip-*`, `google/siglip2-*` on the Hugging Face Hub), as timm's copies
(timm `vision_transformer.py`: architectures, resolutions). They output the pooled
features (the MAP head) and have no classes (`num_classes` 0). Their preprocessing is
the release's (its HF image processor): pixels in [-1, 1] (mean = std = 0.5), the whole
image resized, bicubically (SigLIP) or bilinearly (SigLIP 2, as big_vision's `resize`).
timm's `pretrained_cfg` keeps its default 0.9 crop for them.

NaFlex (SigLIP 2's native resolution): `naflex` entries, HF's `Siglip2VisionModel` and
`Siglip2Model` directories. Their models take `keras_vit.naflex_inputs`' patches (the
release's `Siglip2ImageProcessor`: each image resized bilinearly by PIL, aspect kept, to
the largest patch grid within `max_num_patches`), their 16x16 position table resampled
to each image's grid (`pos_interpolation="bilinear_antialias"`); the patch embedding is
a Linear on the flattened patches, the official kernel in its (row, column, channel)
order.

timm's NaFlexVit of SigLIP's architecture (`naflexvit_base_patch16_siglip`,
`naflexvit_so400m_patch16_siglip`, timm `naflexvit.py`), a model folder as timm's
`save_for_hf` writes it: the same NaFlex model (its `embeds.proj` Linear on the
(row, column, channel) patches, its `embeds.pos_embed` table `(1, rows, cols, D)`
resampled bilinearly with antialias to each image's grid, the MAP head `attn_pool`),
built from its config's `model_args` (`timm_arguments`).

HF's SigLIP vision encoder is CLIP's (`keras_vit.families.clip.HF_TOWER_RENAMES`);
big_vision's `.npz` files are read by the generic reader.
"""

import math

import numpy as np

from keras_vit.families.clip import HF_TOWER_NAMES, HF_TOWER_RENAMES
from keras_vit.families.family import (
    MAP_ATTENTION_KEY,
    MAP_HEAD_KEY,
    TIMM_HUB,
    Family,
    TorchName,
    WeightsEntry,
)

_SIGLIP = dict(classifier="map", gelu_approximate=True, include_top=False)
_SO400M = dict(patch_size=14, hidden_dim=1152, mlp_dim=4304, num_heads=16, num_layers=27)
_PREPROCESSING = dict(mean=(0.5,) * 3, std=(0.5,) * 3, crop_fraction=None)
# (timm name, variant (None: model_args), resolution, switches, interpolation); the
# release's HF id in the comment.
_WEBLI = [
    ("vit_base_patch16_siglip_224.webli", "B/16", 224,  # google/siglip-base-patch16-224
     _SIGLIP, "bicubic"),
    ("vit_so400m_patch14_siglip_384.webli", None, 384,  # google/siglip-so400m-patch14-384
     dict(_SIGLIP, **_SO400M), "bicubic"),
    ("vit_base_patch16_siglip_224.v2_webli", "B/16", 224,  # google/siglip2-base-patch16-224
     _SIGLIP, "bilinear"),
]
_NAFLEX = dict(naflex=True, pos_interpolation="bilinear_antialias")
# The released NaFlex checkpoints (HF `Siglip2Model` files: the image tower is read, the
# text tower left out): (HF id, variant, switches). Their table is a 16x16 grid.
_NAFLEX_RELEASES = [
    ("google/siglip2-base-patch16-naflex", "B/16", _SIGLIP),
    ("google/siglip2-so400m-patch16-naflex", None, dict(_SIGLIP, **{**_SO400M, "patch_size": 16})),
]
HF_HUB = "https://huggingface.co/{name}/resolve/main/model.safetensors"


def _entries():
    webli = [
        WeightsEntry(
            name=name, url=TIMM_HUB.format(name=name), variant=variant, image_size=image_size,
            num_classes=0, pretraining="WebLI", model_args=dict(switches),
            **dict(_PREPROCESSING, interpolation=interpolation),
        )
        for name, variant, image_size, switches, interpolation in _WEBLI
    ]
    # Named by their HF id, whose processor resizes with PIL's antialiased bilinear.
    naflex = [
        WeightsEntry(
            name=name.split("/")[1], url=HF_HUB.format(name=name), variant=variant,
            image_size=16 * 16, num_classes=0, pretraining="WebLI",
            model_args=dict(switches, **_NAFLEX),
            **dict(_PREPROCESSING, interpolation="bilinear", antialias=True),
        )
        for name, variant, switches in _NAFLEX_RELEASES
    ]
    return webli + naflex


def _hf_arguments(config, top, architecture):
    """A SigLIP without its MAP head outputs its `last_hidden_state`; a SigLIP 2 NaFlex
    tower's table is the square grid of its `num_patches`, the image size it stands for
    (its config has no `image_size`)."""
    args = {} if config.get("vision_use_head", True) else dict(pooling=False)
    if architecture.startswith("Siglip2"):
        count = config.get("num_patches", 256)
        side = math.isqrt(count)
        if side * side != count:
            raise ValueError(
                f"num_patches={count} is not a square grid: keras-vit resamples SigLIP 2's "
                "position table as a square grid, as transformers does."
            )
        args["image_size"] = side * config.get("patch_size", 16)
    return args


# The MAP head (HF's `head`, timm's `attn_pool`); SigLIP 2's Linear patch embedding (its
# weight 2-D, where the convolutions' is 4-D).
_TORCH_NAMES = HF_TOWER_NAMES + (
    TorchName("embedding", "dense", r"embeddings\.patch_embeddings\.projection", r"embeds\.proj"),
    TorchName(MAP_HEAD_KEY + "/probe", "copy", r"head\.probe", r"attn_pool\.latent"),
    TorchName(MAP_ATTENTION_KEY, "qkv", r"head\.attention\.in_proj", None),
    TorchName(MAP_ATTENTION_KEY + "/query", "heads_in", None, r"attn_pool\.q"),
    TorchName(MAP_ATTENTION_KEY, "kv", None, r"attn_pool\.kv"),
    TorchName(MAP_ATTENTION_KEY + "/out", "heads_out", r"head\.attention\.out_proj",
              r"attn_pool\.proj"),
    TorchName(MAP_HEAD_KEY + "/LayerNorm_0", "norm", r"head\.layernorm", r"attn_pool\.norm"),
    TorchName(MAP_HEAD_KEY + "/MlpBlock_0/Dense_0", "dense", r"head\.mlp\.fc1",
              r"attn_pool\.mlp\.fc1"),
    TorchName(MAP_HEAD_KEY + "/MlpBlock_0/Dense_1", "dense", r"head\.mlp\.fc2",
              r"attn_pool\.mlp\.fc2"),
)
_HF_SWITCHES = dict(classifier="map", include_top=False)

# timm's NaFlexVit architectures of SigLIP's: (embed_dim, depth, num_heads, mlp_ratio).
_TIMM_NAFLEX = {
    "naflexvit_base_patch16_siglip": (768, 12, 12, 4.0),
    "naflexvit_so400m_patch16_siglip": (1152, 27, 16, 3.7362),
}
# The `model_args` that change nothing keras-vit builds differently (`img_size` is the
# resolution of timm's non-NaFlex input only), with the value each must have.
_TIMM_NAFLEX_FIXED = dict(in_chans=3, global_pool="map")
_TIMM_NAFLEX_SIZES = ("embed_dim", "depth", "num_heads", "mlp_ratio", "patch_size",
                      "pos_embed_grid_size", "num_classes", "img_size")


def timm_arguments(architecture, model_args):
    """The `keras_vit.ViT` arguments of a timm NaFlexVit folder of SigLIP's architecture
    created with timm's `model_args`: a NaFlex model whose position table is the grid
    `pos_embed_grid_size` (16x16 by default) of `patch_size` patches, its classes
    `num_classes` (0, the tower as released, where `model_args` leaves it out); None for
    another architecture. A `model_args` entry keras-vit does not build is a
    `ValueError` naming it.

    Example:

    >>> args = timm_arguments("naflexvit_base_patch16_siglip", dict(embed_dim=32, depth=2,
    ...     num_heads=4, mlp_ratio=1.5, patch_size=4, pos_embed_grid_size=[4, 6]))
    >>> args["hidden_dim"], args["mlp_dim"], args["image_size"], args["include_top"]
    (32, 48, (16, 24), False)
    >>> timm_arguments("naflexvit_so400m_patch16_siglip", {})["mlp_dim"]
    4304
    """
    if architecture not in _TIMM_NAFLEX:
        return None
    for key, value in model_args.items():
        if key not in _TIMM_NAFLEX_SIZES and _TIMM_NAFLEX_FIXED.get(key, object()) != value:
            raise ValueError(
                f"timm {architecture} with {key}={value!r}: keras-vit builds timm's "
                f"NaFlexVit of SigLIP's architecture with {', '.join(_TIMM_NAFLEX_SIZES)} "
                "changed only; leave it out."
            )
    width, depth, heads, ratio = _TIMM_NAFLEX[architecture]
    width = model_args.get("embed_dim", width)
    patch = model_args.get("patch_size", 16)
    grid = model_args.get("pos_embed_grid_size", (16, 16))
    rows, cols = (grid, grid) if isinstance(grid, int) else grid
    classes = model_args.get("num_classes", 0)
    return dict(
        _SIGLIP, **_NAFLEX, hidden_dim=width, num_layers=model_args.get("depth", depth),
        num_heads=model_args.get("num_heads", heads),
        mlp_dim=int(width * model_args.get("mlp_ratio", ratio)), patch_size=patch,
        image_size=(rows * patch, cols * patch), num_classes=classes,
        include_top=classes > 0,
    )


def timm_layout(arrays, notes):
    """Rewrites a timm NaFlexVit state dict in place: its position table `embeds.pos_embed`
    `(1, rows, cols, D)` as timm ViT's `pos_embed` `(1, rows * cols, D)` (row-major, as
    NaFlexVit adds it to the patches). Another file is left as it is.

    Returns:
        `{}`: the tensors show all it needs.
    """
    table = arrays.get("embeds.pos_embed")
    if table is not None and table.ndim == 4:
        arrays["pos_embed"] = np.reshape(arrays.pop("embeds.pos_embed"), (1, -1, table.shape[-1]))
    return {}
_HF_NAFLEX = dict(_HF_SWITCHES, **_NAFLEX)

FAMILY = Family(
    name="siglip",
    switches={"siglip": _SIGLIP, "so400m": _SO400M},
    entries=tuple(_entries()),
    # `pooler_output` (the MAP head); a full SiglipModel directory: its vision_config,
    # the image features.
    hf_architectures={"SiglipVisionModel": _HF_SWITCHES, "SiglipModel": _HF_SWITCHES,
                      "Siglip2VisionModel": _HF_NAFLEX, "Siglip2Model": _HF_NAFLEX},
    hf_model_types={"Siglip": ("siglip", "siglip_vision_model"),
                    "Siglip2": ("siglip2", "siglip2_vision_model")},
    # What config.json leaves out takes SiglipVisionConfig's default.
    hf_config_defaults=dict(layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh"),
    hf_arguments=_hf_arguments,
    hf_pools=True,
    hf_prefixes=("vision_model",),
    hf_renames=HF_TOWER_RENAMES + (
        (r"^head\.attention\.in_proj_(weight|bias)$", r"head.attention.in_proj.\1"),
    ),
    torch_names=_TORCH_NAMES,
    timm_layout=timm_layout,
    timm_arguments=timm_arguments,
)
