"""DINOv2, with and without registers, its giant model's SwiGLU MLP: timm's copies of
Meta's backbones, HF transformers' `Dinov2*` models and timm's DINOv2 names.

Registry sources: `lvd142m` (DINOv2, with and without registers): timm's safetensors
copies of Meta's backbones, the weights of HF's `facebook/dinov2-{small,base,large,giant}`
and `facebook/dinov2-with-registers-*` (timm `vision_transformer.py`: architectures,
518 px, no head, ImageNet mean and std, bicubic, `crop_pct` 1.0). The release reports
linear-probe accuracies of heads it ships apart, not of these files: no top-1.
"""

from keras_vit.families.family import (
    BLOCK_KEY,
    HF_LAYER,
    TIMM_HUB,
    Family,
    TorchName,
    WeightsEntry,
)
from keras_vit.models.preprocessing import IMAGENET_MEAN, IMAGENET_STD

# timm vision_transformer.py: layer scale 1e-5; the giant model's SwiGLU MLP, 2/3 of
# mlp_ratio 5.33334 (timm's SwiGLUPacked fc1 packs 2 x 4096).
_LAYER_SCALE = dict(layer_scale_init=1e-5)
_DINOV2_GIANT = dict(patch_size=14, hidden_dim=1536, num_layers=40, num_heads=24,
                     mlp_dim=4096, mlp="swiglu")
# timm stores the registers' models with no_embed_class (the class token's position
# folded into it).
_REGISTERS = dict(num_registers=4, no_embed_class=True)
_DINOV2 = [  # (timm architecture, variant (None: giant), switches)
    ("vit_small_patch14_dinov2", "S/14", {}),
    ("vit_base_patch14_dinov2", "B/14", {}),
    ("vit_large_patch14_dinov2", "L/14", {}),
    ("vit_giant_patch14_dinov2", None, _DINOV2_GIANT),
    ("vit_small_patch14_reg4_dinov2", "S/14", _REGISTERS),
    ("vit_base_patch14_reg4_dinov2", "B/14", _REGISTERS),
    ("vit_large_patch14_reg4_dinov2", "L/14", _REGISTERS),
    ("vit_giant_patch14_reg4_dinov2", None, dict(_DINOV2_GIANT, **_REGISTERS)),
]


def _dinov2_entries():
    return [
        WeightsEntry(
            name=f"{arch}.lvd142m",
            url=TIMM_HUB.format(name=f"{arch}.lvd142m"),
            variant=variant,
            image_size=518,
            num_classes=0,
            pretraining="LVD-142M",
            model_args=dict(switches, **_LAYER_SCALE, include_top=False),
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            interpolation="bicubic",
            crop_fraction=1.0,
        )
        for arch, variant, switches in _DINOV2
    ]


def _hf_arguments(config, top, architecture):
    """The `keras_vit.ViT` switches of an HF DINOv2 config: layer scale, the MLP (its
    width from `mlp_ratio`, SwiGLU's two thirds of it rounded up to a multiple of 8, as
    `Dinov2SwiGLUFFN`) and the registers."""
    width = int(config.get("hidden_size", 768) * config.get("mlp_ratio", 4))
    swiglu = bool(config.get("use_swiglu_ffn", False))
    return dict(
        mlp_dim=(int(width * 2 / 3) + 7) // 8 * 8 if swiglu else width,
        mlp="swiglu" if swiglu else "gelu",
        layer_scale_init=float(config.get("layerscale_value", 1.0)),
        num_registers=int(config.get("num_register_tokens", 0)),
    )


# The register tokens `reg` (1, count, D) and HF's layer scales beside the official keys.
_TORCH_NAMES = (
    TorchName("reg", "copy", r"embeddings\.register_tokens", r"(?:embeds\.)?reg_token"),
    TorchName(BLOCK_KEY + "LayerScale_attention/scale", "scale",
              HF_LAYER + r"layer_scale1\.lambda1", None),
    TorchName(BLOCK_KEY + "LayerScale_mlp/scale", "scale",
              HF_LAYER + r"layer_scale2\.lambda1", None),
)
# DINOv2's files name the block's parts as timm does; SwiGLU's packed `weights_in`
# (gate | up, as timm's SwiGLUPacked `fc1`) and `weights_out` are its fc1 and fc2.
_HF_RENAMES = (
    (r"^encoder\.layer\.(\d+)\.norm1\.", r"encoder.layer.\1.layernorm_before."),
    (r"^encoder\.layer\.(\d+)\.norm2\.", r"encoder.layer.\1.layernorm_after."),
    (r"^encoder\.layer\.(\d+)\.mlp\.(fc1|weights_in)\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^encoder\.layer\.(\d+)\.mlp\.(fc2|weights_out)\.", r"encoder.layer.\1.output.dense."),
)
# Every HF DINOv2 model takes any size, the position table resampled as
# `interpolate_pos_encoding` does (plain bicubic; antialiased with registers).
_PLAIN = dict(dynamic_image_size=True, pos_interpolation="bicubic")
_WITH_REGISTERS = dict(dynamic_image_size=True, pos_interpolation="bicubic_antialias")

FAMILY = Family(
    name="dinov2",
    switches={"dinov2": _LAYER_SCALE, "registers": _REGISTERS, "giant": _DINOV2_GIANT},
    entries=tuple(_dinov2_entries()),
    hf_architectures={
        # `pooler_output` is the normed class token.
        "Dinov2Model": dict(include_top=False, **_PLAIN),
        "Dinov2WithRegistersModel": dict(include_top=False, **_WITH_REGISTERS),
        # The head reads the class token and the mean of the patch tokens.
        "Dinov2ForImageClassification": dict(classifier="token_gap", **_PLAIN),
        "Dinov2WithRegistersForImageClassification": dict(
            classifier="token_gap", **_WITH_REGISTERS
        ),
    },
    hf_model_types={"Dinov2WithRegisters": ("dinov2_with_registers",), "Dinov2": ("dinov2",)},
    # transformers' own default, which config.json leaves out when it is used.
    hf_config_defaults=dict(layer_norm_eps=1e-6),
    hf_arguments=_hf_arguments,
    hf_pools=True,
    hf_prefixes=("dinov2", "dinov2_with_registers"),
    hf_renames=_HF_RENAMES,
    torch_names=_TORCH_NAMES,
)
