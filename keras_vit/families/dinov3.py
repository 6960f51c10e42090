"""DINOv3 (Meta 2025, Siméoni et al., arXiv 2508.10104): its switches, its registry
entries and their preprocessing, HF `DINOv3ViTModel` configs and tensors, and timm's
`vit_*_patch16_dinov3` files.

A DINOv3 is the ViT with a class token and 4 registers, no position table, a rotary
position embedding on the patch tokens' queries and keys
(`keras_vit.layers.dinov3_rope.DINOv3RotaryEmbedding`: patch centres on [-1, 1], so any
image size whose sides are multiples of 16 runs), layer scale, LayerNorms of epsilon
1e-5, and a GELU MLP (S, B, L) or SwiGLU (S+, H+, 7B). Its attention has no key bias (the
7B none at all; timm's copies keep none): an absent bias is loaded as zeros, which is
exact (a key bias adds the same logit to every key of a query, which the softmax
removes). Its `pooler_output` is the class token after the final norm.

DINOv3 rotates each query and key channel with the one half a head away (HF's
`rotate_half`, timm's `rope_rotate_half=True`); keras-vit's attention rotates
interleaved channel pairs. Loading a checkpoint reorders each head's query and key
channels (`(c_0, c_{h/2}, c_1, c_{h/2+1}, ...)`), which leaves every product of a
query with a key, hence the model's outputs, unchanged.

Registry sources: timm's copies on the Hugging Face Hub (timm `eva.py`:
`vit_{small,small_plus,base,large,huge_plus,7b}_patch16_dinov3.{lvd1689m,sat493m}`),
the weights of HF's `facebook/dinov3-{vits16,vits16plus,vitb16,vitl16,vith16plus,
vit7b16}-pretrain-{lvd1689m,sat493m}`, backbones without a head. Their preprocessing is
HF's `DINOv3ViTImageProcessor`: the whole image resized to 224 x 224 by the antialiased
bilinear filter (PIL's), with ImageNet's mean and std; the satellite (SAT-493M) models
take the release's satellite statistics (DINOv3 README, timm's `pretrained_cfg`).
"""

import re

import numpy as np

from keras_vit.families.family import (
    ATTENTION_KEY,
    HF_LAYER,
    TIMM_BLOCK,
    TIMM_HUB,
    Family,
    TorchName,
    WeightsEntry,
)
from keras_vit.models.preprocessing import IMAGENET_MEAN, IMAGENET_STD

ROPE_TEMPERATURE = 100.0  # HF's rope_theta, timm's rope_temperature, in every release


def rope(temperature=ROPE_TEMPERATURE):
    """The `keras_vit.ViT` `rope` argument of a DINOv3: its rotary embedding's layer
    config (the model fills in the head width, grid and prefix tokens)."""
    # By its registered name (`keras_vit.layers.dinov3_rope`): a family module imports
    # no Keras, so that resolving a source stays light.
    return {"class_name": "keras_vit>DINOv3RotaryEmbedding",
            "config": {"temperature": float(temperature)}}


# What every DINOv3 is built with: any image size runs (HF's model takes any multiple of
# the patch; timm's `dynamic_img_size=True`), and the backbone outputs its pooled class token.
SWITCHES = dict(
    pos_embedding="none", num_registers=4, layer_scale_init=1e-5, layer_norm_epsilon=1e-5,
    rope=rope(), dynamic_image_size=True, include_top=False,
)
# timm architecture -> (embed_dim, depth, num_heads, mlp_ratio, SwiGLU's hidden-width
# alignment or None for the GELU MLP), timm eva.py: the release's MLP widths (HF's
# conversion script: S+, H+ 2/3 of 6 D; 7B 2/3 of 3 D).
_TIMM = {
    "vit_small_patch16_dinov3": (384, 12, 6, 4, None),
    "vit_small_plus_patch16_dinov3": (384, 12, 6, 4, 8),
    "vit_base_patch16_dinov3": (768, 12, 12, 4, None),
    "vit_large_patch16_dinov3": (1024, 24, 16, 4, None),
    "vit_huge_plus_patch16_dinov3": (1280, 32, 20, 4, 8),
    "vit_7b_patch16_dinov3": (4096, 40, 32, 2, 64),
}


def _timm_sizes(architecture, embed_dim=None, depth=None, num_heads=None, mlp_ratio=None):
    """The `keras_vit.ViT` sizes and MLP of timm's `architecture`, with the timm
    arguments given in place of its own (`int(embed_dim * mlp_ratio)`, SwiGLU's
    aligned up as timm's `swiglu_align_to`)."""
    width, layers, heads, ratio, align = _TIMM[architecture]
    width = embed_dim or width
    hidden = int(width * (mlp_ratio or ratio))
    sizes = dict(hidden_dim=width, num_layers=depth or layers, num_heads=num_heads or heads,
                 mlp_dim=hidden + (-hidden % align if align else 0))
    return sizes if align is None else dict(sizes, mlp="swiglu")


def timm_arguments(architecture, model_args):
    """The `keras_vit.ViT` arguments of a timm DINOv3 folder (`vit_*_patch16_dinov3`,
    `_qkvb` too: zero q and v biases) created with timm's `model_args`; None for
    another architecture."""
    base = (architecture or "").removesuffix("_qkvb")
    if base not in _TIMM:
        return None
    sizes = {k: model_args.get(k) for k in ("embed_dim", "depth", "num_heads", "mlp_ratio")}
    image_size = model_args.get("img_size", 224)
    return dict(SWITCHES, patch_size=16, image_size=tuple(image_size) if isinstance(
        image_size, (list, tuple)) else image_size, **_timm_sizes(base, **sizes))


# The release's satellite pixel statistics (DINOv3 README; timm's sat493m pretrained_cfg).
SAT493M_MEAN = (0.430, 0.411, 0.296)
SAT493M_STD = (0.213, 0.156, 0.143)
# (timm architecture, tag); the HF id in the comment.
_WEIGHTS = [
    ("vit_small_patch16_dinov3", "lvd1689m"),  # facebook/dinov3-vits16-pretrain-lvd1689m
    ("vit_small_plus_patch16_dinov3", "lvd1689m"),  # facebook/dinov3-vits16plus-pretrain-lvd1689m
    ("vit_base_patch16_dinov3", "lvd1689m"),  # facebook/dinov3-vitb16-pretrain-lvd1689m
    ("vit_large_patch16_dinov3", "lvd1689m"),  # facebook/dinov3-vitl16-pretrain-lvd1689m
    ("vit_huge_plus_patch16_dinov3", "lvd1689m"),  # facebook/dinov3-vith16plus-pretrain-lvd1689m
    ("vit_7b_patch16_dinov3", "lvd1689m"),  # facebook/dinov3-vit7b16-pretrain-lvd1689m
    ("vit_large_patch16_dinov3", "sat493m"),  # facebook/dinov3-vitl16-pretrain-sat493m
    ("vit_7b_patch16_dinov3", "sat493m"),  # facebook/dinov3-vit7b16-pretrain-sat493m
]
_PRETRAINING = {"lvd1689m": "LVD-1689M", "sat493m": "SAT-493M"}


def _entries():
    return tuple(
        WeightsEntry(
            name=f"{arch}.{tag}", url=TIMM_HUB.format(name=f"{arch}.{tag}"), variant=None,
            image_size=224, num_classes=0, pretraining=_PRETRAINING[tag],
            model_args=dict(SWITCHES, patch_size=16, **_timm_sizes(arch)),
            mean=SAT493M_MEAN if tag == "sat493m" else IMAGENET_MEAN,
            std=SAT493M_STD if tag == "sat493m" else IMAGENET_STD,
            interpolation="bilinear", antialias=True, crop_fraction=None,
        )
        for arch, tag in _WEIGHTS
    )


# ---------------------------------------------------------------------------
# Checkpoints: HF's and timm's names as the official layout reads them, q|k|v fused as
# "qkv_rotate_half" (each head's query and key channels in `rotate_half_order`).

ATTENTION = TorchName(ATTENTION_KEY, "qkv_rotate_half", HF_LAYER + r"attention\.qkv_rotate_half",
                      TIMM_BLOCK + r"attn\.qkv_rotate_half")


def _bias(arrays, key, weight):
    """The bias `key` popped from `arrays`, or zeros as wide as `weight`'s outputs where
    the file has none (DINOv3's key; the 7B's and timm's copies: all)."""
    bias = arrays.pop(key, None)
    return np.zeros(weight.shape[0], weight.dtype) if bias is None else bias


def _move(arrays, source, target, weight_only=False):
    """Renames a Linear's or LayerNorm's `weight` and `bias` (zeros where absent)."""
    weight = arrays.pop(source + "weight")
    arrays[target + "weight"] = weight
    if not weight_only:
        arrays[target + "bias"] = _bias(arrays, source + "bias", weight)


def _pack_swiglu(arrays, gate, up, target):
    """SwiGLU's gate and up projections (prefixes `gate`, `up`) as the packed
    `{target}weight` and `{target}bias` (gate | up), absent biases as zeros."""
    weights = [arrays.pop(p + "weight") for p in (gate, up)]
    biases = [_bias(arrays, p + "bias", w) for p, w in zip((gate, up), weights)]
    arrays[target + "weight"] = np.concatenate(weights)
    arrays[target + "bias"] = np.concatenate(biases)


_HF_BLOCK = re.compile(r"((?:model\.)?layer\.(\d+)\.)attention\.q_proj\.weight")


def hf_layout(arrays, notes):
    """Rewrites an HF `DINOv3ViTModel` state dict (`layer.{i}.` in its files,
    `model.layer.{i}.` in memory) in place into the names of HF's ViT: q, k, v fused as
    "qkv_rotate_half", a gated MLP's `gate_proj | up_proj` packed as SwiGLU's, absent
    biases as zeros.

    Returns:
        DINOv3's rotary embedding (`rope`), which has no tensors; `{}` for another file.
    """
    blocks = [m.groups() for key in list(arrays) if (m := _HF_BLOCK.fullmatch(key))]
    if not blocks:
        return {}
    for name in ("weight", "bias"):
        if f"embeddings.patch_embeddings.{name}" in arrays:
            arrays[f"embeddings.patch_embeddings.projection.{name}"] = arrays.pop(
                f"embeddings.patch_embeddings.{name}")
        if f"norm.{name}" in arrays:
            arrays[f"layernorm.{name}"] = arrays.pop(f"norm.{name}")
    for p, i in blocks:
        t = f"encoder.layer.{i}."
        weights = [arrays.pop(f"{p}attention.{n}_proj.weight") for n in "qkv"]
        arrays[t + "attention.qkv_rotate_half.weight"] = np.concatenate(weights)
        arrays[t + "attention.qkv_rotate_half.bias"] = np.concatenate(
            [_bias(arrays, f"{p}attention.{n}_proj.bias", w) for n, w in zip("qkv", weights)])
        _move(arrays, p + "attention.o_proj.", t + "attention.output.dense.")
        _move(arrays, p + "norm1.", t + "layernorm_before.")
        _move(arrays, p + "norm2.", t + "layernorm_after.")
        for j in (1, 2):
            arrays[f"{t}layer_scale{j}.lambda1"] = arrays.pop(f"{p}layer_scale{j}.lambda1")
        if p + "mlp.gate_proj.weight" in arrays:
            _pack_swiglu(arrays, p + "mlp.gate_proj.", p + "mlp.up_proj.",
                         t + "intermediate.dense.")
        else:
            _move(arrays, p + "mlp.up_proj.", t + "intermediate.dense.")
        _move(arrays, p + "mlp.down_proj.", t + "output.dense.")
    notes.append(_NO_KEY_BIAS)
    return dict(rope=rope())


_NO_KEY_BIAS = ("DINOv3's attention has no key bias: loaded as zeros (a key bias adds the "
                "same logit to every key of a query, which the softmax removes).")


def timm_layout(arrays, notes):
    """Rewrites a timm DINOv3 state dict (timm `Eva` with `rope_type="dinov3"`: registers
    and EVA's layer-scale names, no position table) in place into the names of timm's
    ViT: `gamma_1` / `gamma_2` as `ls1.gamma` / `ls2.gamma`, `qkv` with its q and v biases
    (`q_bias`, `v_bias`; none without `_qkvb`: zeros) and a zero key bias as
    "qkv_rotate_half", SwiGLU's `fc1_g` and `fc1_x` packed as `fc1`. timm's NaFlexVit made
    a DINOv3 (`rope_type="dinov3"`, `rope_rotate_half`, `init_values`) likewise, its
    (its tokens under `embeds.`), its one qkv bias as it is.

    Returns:
        DINOv3's rotary embedding (`rope`), which has no tensors; `{}` for another file.
    """
    # timm's NaFlexVit made a DINOv3 (`rope_type="dinov3"`) holds its tokens under
    # `embeds.` and one qkv bias, its key's included.
    naflex = "embeds.reg_token" in arrays
    tables = ("pos_embed", "embeds.pos_embed")
    if not ((naflex or "reg_token" in arrays) and not any(k in arrays for k in tables)
            and "blocks.0.gamma_1" in arrays):
        return {}
    for key in sorted(arrays):
        block = re.fullmatch(r"(blocks\.\d+\.)attn\.qkv\.weight", key)
        if not block:
            continue
        p = block[1]
        for j in (1, 2):
            arrays[f"{p}ls{j}.gamma"] = arrays.pop(f"{p}gamma_{j}")
        weight = arrays.pop(key)
        arrays[p + "attn.qkv_rotate_half.weight"] = weight
        if p + "attn.qkv.bias" in arrays:  # NaFlexVit's
            arrays[p + "attn.qkv_rotate_half.bias"] = arrays.pop(p + "attn.qkv.bias")
        else:
            q_bias, v_bias = (_bias(arrays, f"{p}attn.{n}_bias", weight[: len(weight) // 3])
                              for n in "qv")
            arrays[p + "attn.qkv_rotate_half.bias"] = np.concatenate(
                [q_bias, np.zeros_like(q_bias), v_bias])
        if p + "mlp.fc1_g.weight" in arrays:
            _pack_swiglu(arrays, p + "mlp.fc1_g.", p + "mlp.fc1_x.", p + "mlp.fc1.")
    if not naflex:
        notes.append(_NO_KEY_BIAS)
    return dict(rope=rope())


# HF `DINOv3ViTConfig`'s defaults, for what a config.json leaves out.
HF_CONFIG_DEFAULTS = dict(
    hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
    hidden_act="gelu", layer_norm_eps=1e-5, rope_theta=100.0, image_size=224, patch_size=16,
    num_channels=3, layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0,
)
# The activation of each MLP keras-vit builds: `use_gated_mlp` (SwiGLU), or not.
_HF_ACTIVATIONS = {True: "silu", False: "gelu"}


def hf_arguments(config, top, architecture):
    """The `keras_vit.ViT` arguments of an HF `DINOv3ViTConfig` (`config`, defaults
    filled in) beyond the generic sizes: the registers, layer scale, the MLP, the rope
    base. An activation keras-vit does not build is a `ValueError` naming it."""
    gated = bool(config["use_gated_mlp"])
    if config["hidden_act"] != _HF_ACTIVATIONS[gated]:
        raise ValueError(
            f"DINOv3 config has hidden_act={config['hidden_act']!r} with use_gated_mlp="
            f"{str(gated).lower()}: keras-vit builds {_HF_ACTIVATIONS[gated]!r} for it "
            f"({'SwiGLU' if gated else 'the GELU MLP'})."
        )
    return dict(
        SWITCHES,
        num_registers=int(config["num_register_tokens"]),
        layer_scale_init=float(config["layerscale_value"]),
        mlp="swiglu" if gated else "gelu",
        rope=rope(config["rope_theta"]),
    )


FAMILY = Family(
    name="dinov3",
    switches={"dinov3": SWITCHES},
    entries=_entries(),
    hf_architectures={"DINOv3ViTModel": dict(include_top=False, dynamic_image_size=True)},
    hf_model_types={"DINOv3ViT": ("dinov3_vit",)},
    hf_config_defaults=HF_CONFIG_DEFAULTS,
    hf_arguments=hf_arguments,
    hf_pools=True,
    torch_names=(ATTENTION,),
    timm_layout=timm_layout,
    hf_layout=hf_layout,
    timm_arguments=timm_arguments,
)
