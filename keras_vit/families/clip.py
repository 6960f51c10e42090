"""CLIP's image tower (OpenAI's, and LAION's with the exact GELU): timm's copies of
OpenAI's release, HF transformers' `CLIPVisionModel[WithProjection]` and `CLIPModel`, and
timm's CLIP names.

Registry sources: `openai`: the image towers of OpenAI's release (`openai/clip-vit-*` on
the Hugging Face Hub), as timm's copies (timm `vision_transformer.py`: architectures,
resolutions). They output the image embedding (CLIP's projection) and have no classes
(`num_classes` 0). Their preprocessing is the release's (its HF image processor):
OpenAI's mean and std, bicubic, the central crop of the resized short side (fraction
1.0); timm's `pretrained_cfg` keeps its default 0.9 crop.

HF's CLIP vision encoder names (`HF_TOWER_RENAMES`, `HF_TOWER_NAMES`) are SigLIP's too
(`keras_vit.families.siglip`, whose transformers model copies CLIP's encoder).
"""

from keras_vit.families.family import (
    POS_KEY,
    PRE_NORM_KEY,
    PROJECTION_KEY,
    TIMM_HUB,
    Family,
    TorchName,
    WeightsEntry,
)
from keras_vit.models.preprocessing import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

_CLIP = dict(pre_norm=True, quick_gelu=True, patch_bias=False, layer_norm_epsilon=1e-5,
             include_top=False)
_PREPROCESSING = dict(mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
                      crop_fraction=1.0)
# (timm name, variant, projection width); the release's HF id in the comment.
_OPENAI = [
    ("vit_base_patch32_clip_224.openai", "B/32", 512),  # openai/clip-vit-base-patch32
    ("vit_base_patch16_clip_224.openai", "B/16", 512),  # openai/clip-vit-base-patch16
    ("vit_large_patch14_clip_224.openai", "L/14", 768),  # openai/clip-vit-large-patch14
]


def _entries():
    return [
        WeightsEntry(
            name=name, url=TIMM_HUB.format(name=name), variant=variant, image_size=224,
            num_classes=0, pretraining="WIT-400M", model_args=dict(_CLIP, projection_dim=width),
            **_PREPROCESSING,
        )
        for name, variant, width in _OPENAI
    ]


def _timm_layout(arrays, notes):
    """timm holds a CLIP tower's image projection as its head, with a zero bias
    (`_convert_openai_clip`): a tower (`norm_pre`) whose head has no bias, or a zero
    one, gets it back as the bias-free `projection`.

    Returns:
        `{}`: the tensors show all of CLIP's switches.
    """
    bias = arrays.get("head.bias")
    if "norm_pre.weight" in arrays and "head.weight" in arrays and (bias is None or not bias.any()):
        arrays["visual_projection.weight"] = arrays.pop("head.weight")
        arrays.pop("head.bias", None)
        notes.append("timm's CLIP head without a bias is the image projection (projection_dim).")
    return {}


# The HF vision tower's encoder (CLIP's and SigLIP's, `vision_model.` in their full
# models' files) as HF ViT's names.
_LAYERS, _LAYER = r"^encoder\.layers\.(\d+)\.", r"encoder.layer.\1."
HF_TOWER_RENAMES = (
    (_LAYERS + r"self_attn\.q_proj\.", _LAYER + "attention.attention.query."),
    (_LAYERS + r"self_attn\.k_proj\.", _LAYER + "attention.attention.key."),
    (_LAYERS + r"self_attn\.v_proj\.", _LAYER + "attention.attention.value."),
    (_LAYERS + r"self_attn\.out_proj\.", _LAYER + "attention.output.dense."),
    (_LAYERS + r"layer_norm1\.", _LAYER + "layernorm_before."),
    (_LAYERS + r"layer_norm2\.", _LAYER + "layernorm_after."),
    (_LAYERS + r"mlp\.fc1\.", _LAYER + "intermediate.dense."),
    (_LAYERS + r"mlp\.fc2\.", _LAYER + "output.dense."),
    (r"^embeddings\.patch_embedding\.", r"embeddings.patch_embeddings.projection."),
    (r"^post_layernorm\.", "layernorm."),
)
# HF's position table without a batch axis.
HF_TOWER_NAMES = (TorchName(POS_KEY, "rows", r"embeddings\.position_embedding\.weight", None),)
# HF's class token without a batch axis, the LayerNorm before the blocks and the
# projection to the image-text embedding.
_TORCH_NAMES = HF_TOWER_NAMES + (
    TorchName("cls", "token", r"embeddings\.class_embedding", None),
    TorchName(PRE_NORM_KEY, "norm", r"pre_layrnorm", r"norm_pre"),
    TorchName(PROJECTION_KEY, "dense", r"visual_projection", r"visual_projection"),
)
_HF_SWITCHES = dict(pre_norm=True, patch_bias=False, include_top=False)


def _hf_arguments(config, top, architecture):
    """The projection's width of a tower with one (its `image_embeds`)."""
    if architecture in ("CLIPVisionModelWithProjection", "CLIPModel"):
        return dict(projection_dim=top.get("projection_dim", config["projection_dim"]))
    return {}


FAMILY = Family(
    name="clip",
    switches={"openai": _CLIP},
    entries=tuple(_entries()),
    # `pooler_output` (the class token after the final norm), or with the projection its
    # `image_embeds` (a full CLIPModel directory: its vision_config, the image features).
    hf_architectures={
        "CLIPVisionModel": _HF_SWITCHES,
        "CLIPVisionModelWithProjection": _HF_SWITCHES,
        "CLIPModel": _HF_SWITCHES,
    },
    hf_model_types={"CLIP": ("clip", "clip_vision_model")},
    # What config.json leaves out takes CLIPVisionConfig's / CLIPConfig's default.
    hf_config_defaults=dict(layer_norm_eps=1e-5, hidden_act="quick_gelu", patch_size=32,
                            projection_dim=512),
    hf_arguments=_hf_arguments,
    hf_pools=True,
    hf_prefixes=("vision_model",),
    hf_renames=HF_TOWER_RENAMES,
    torch_names=_TORCH_NAMES,
    timm_layout=_timm_layout,
)
