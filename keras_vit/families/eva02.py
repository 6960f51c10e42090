"""EVA-02: timm's copies of BAAI's files and timm's EVA names (`eva.py`).

Registry sources: `mim_in22k`, `mim_m38m` and their `_ft_*` fine-tunes: timm's
safetensors copies of BAAI's files (timm `eva.py`: architectures, resolutions, classes,
OpenAI CLIP mean and std, bicubic, `crop_pct`, `crop_mode="squash"` as the whole image
resized), with the ImageNet-1k top-1 of timm's `results/results-imagenet.csv`.
"""

import re

import numpy as np

from keras_vit.families.family import (
    BLOCK_KEY,
    IMAGENET1K_CLASSES,
    MLP_NORM_KEY,
    TIMM_BLOCK,
    TIMM_HUB,
    Family,
    TorchName,
    WeightsEntry,
)
from keras_vit.models.preprocessing import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

# Every eva02_* model: SwiGLU of hidden width int(D * 4 * 2 / 3), 2-D rotary position
# embedding scaled to the 224 px grid (`ref_feat_shape=(16, 16)`), the class token left
# out of the mean pooling, and the final norm after it (`global_pool="avg"`, `fc_norm`).
# Rope has no tensors, so a file alone does not say it (`use_rot_pos_emb=True`,
# `ref_feat_shape=(16, 16)` in timm's every `eva02_*`).
_ROPE = dict(rope=True, rope_reference_grid=(16, 16))
_EVA02 = dict(patch_size=14, num_layers=12, mlp="swiglu", **_ROPE, classifier="avg",
              fc_norm=True)
_EVA02_SIZES = {  # hidden_dim, num_heads, mlp_dim, layers; base and large: scale_mlp
    "tiny": dict(hidden_dim=192, num_heads=3, mlp_dim=512),
    "small": dict(hidden_dim=384, num_heads=6, mlp_dim=1024),
    "base": dict(hidden_dim=768, num_heads=12, mlp_dim=2048, mlp_norm=True),
    "large": dict(hidden_dim=1024, num_heads=16, mlp_dim=2730, num_layers=24, mlp_norm=True),
}
_EVA02_PRETRAINING = {"mim_in22k": "ImageNet-22k (MIM)", "mim_m38m": "Merged-38M (MIM)"}
# (size, resolution, tag, classes, ImageNet-1k top-1 in timm's results-imagenet.csv);
# timm's `_cfg`: crop_pct 1.0 for the fine-tunes, `crop_mode="squash"` (the whole image
# resized) for the in22k ones, its 0.9 default for the MIM backbones.
_EVA02_WEIGHTS = [
    ("tiny", 224, "mim_in22k", 0, None),
    ("small", 224, "mim_in22k", 0, None),
    ("base", 224, "mim_in22k", 0, None),
    ("large", 224, "mim_in22k", 0, None),
    ("large", 224, "mim_m38m", 0, None),
    ("tiny", 336, "mim_in22k_ft_in1k", 1000, 80.648),
    ("small", 336, "mim_in22k_ft_in1k", 1000, 85.770),
    ("base", 448, "mim_in22k_ft_in1k", 1000, 88.262),
    ("large", 448, "mim_in22k_ft_in1k", 1000, 89.634),
    ("large", 448, "mim_m38m_ft_in1k", 1000, 89.550),
    ("base", 448, "mim_in22k_ft_in22k_in1k", 1000, 88.678),
    ("large", 448, "mim_in22k_ft_in22k_in1k", 1000, 89.956),
    ("large", 448, "mim_m38m_ft_in22k_in1k", 1000, 90.056),
    ("base", 448, "mim_in22k_ft_in22k", 21841, None),
    ("large", 448, "mim_in22k_ft_in22k", 21841, None),
    ("large", 448, "mim_m38m_ft_in22k", 21841, None),
]


def _eva02_entries():
    entries = []
    for size, image_size, tag, classes, top1 in _EVA02_WEIGHTS:
        name = f"eva02_{size}_patch14_{image_size}.{tag}"
        pretraining = tag.split("_ft_")[0]
        finetuning = {"ft_in1k": "ImageNet-1k", "ft_in22k": "ImageNet-22k",
                      "ft_in22k_in1k": "ImageNet-22k > ImageNet-1k"}.get(tag[len(pretraining) + 1:])
        entries.append(WeightsEntry(
            name=name, url=TIMM_HUB.format(name=name), variant=None, image_size=image_size,
            num_classes=classes, labels="imagenet1k" if classes == IMAGENET1K_CLASSES else None,
            pretraining=_EVA02_PRETRAINING[pretraining], finetuning=finetuning, top1=top1,
            model_args=dict(_EVA02, **_EVA02_SIZES[size],
                            **({} if classes else dict(include_top=False))),
            mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
            crop_fraction=None if tag.endswith("ft_in22k") or "in22k_in1k" in tag
            else 1.0 if classes else 0.9,
        ))
    return entries



def _timm_layout(arrays, notes):
    """EVA's timm names (timm `eva.py`) as the other timm ViTs': its q and v biases
    (`attn.q_bias`, `attn.v_bias`; EVA-02 base and large: separate `attn.{q,k,v}_proj`)
    as one `attn.qkv` with a zero key bias, and EVA-02's SwiGLU's `mlp.fc1_g` (gate) and
    `mlp.fc1_x` as the packed `mlp.fc1` (gate | up).

    Returns:
        The arguments no tensor shows that the checkpoint was trained with: the rope of
        an EVA-02 (that attention with a SwiGLU MLP, packed `fc1` twice as wide as `fc2`
        takes, or `fc1_g`/`fc1_x`); `{}` for another file, EVA-01's (the same attention
        with a plain MLP, no rope) too.
    """
    def pop_bias(name, like):
        bias = arrays.pop(name, None)
        return np.zeros(like.shape[0], like.dtype) if bias is None else bias

    fc1, fc2 = (arrays.get(f"blocks.0.mlp.fc{i}.weight") for i in (1, 2))
    swiglu = "blocks.0.mlp.fc1_g.weight" in arrays or (
        fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[-1]
    )
    found = False
    for key in sorted(arrays):
        attention = re.fullmatch(r"(blocks\.\d+\.attn\.)(q_bias|q_proj\.weight)", key)
        mlp = re.fullmatch(r"(blocks\.\d+\.mlp\.)fc1_g\.weight", key)
        if attention:
            p = attention[1]
            if attention[2] == "q_proj.weight":
                weights = [arrays.pop(f"{p}{name}_proj.weight") for name in "qkv"]
                arrays[p + "qkv.weight"] = np.concatenate(weights)
                q, v = (pop_bias(f"{p}{name}_proj.bias", weights[0]) for name in "qv")
                arrays.pop(p + "k_proj.bias", None)  # none in timm's EVA
            else:
                q, v = arrays.pop(p + "q_bias"), arrays.pop(p + "v_bias")
            arrays[p + "qkv.bias"] = np.concatenate([q, np.zeros_like(q), v])
            found = True
        elif mlp:
            p = mlp[1]
            gate, up = (arrays.pop(f"{p}fc1_{name}.weight") for name in "gx")
            arrays[p + "fc1.weight"] = np.concatenate([gate, up])
            arrays[p + "fc1.bias"] = np.concatenate(
                [pop_bias(f"{p}fc1_{name}.bias", w) for name, w in (("g", gate), ("x", up))]
            )
    rope = [key for key in arrays if key.startswith("rope.")]
    for key in rope:  # computed from the patch grid, not learned
        del arrays[key]
    if found:
        notes.append(
            "EVA-02's attention has no key bias: loaded as zeros (a key bias adds the same "
            "logit to every key of a query, which the softmax removes)."
        )
    return dict(_ROPE) if found and swiglu else {}


# The LayerNorm inside the MLP, and the norm after the pooling (timm's `fc_norm`).
_TORCH_NAMES = (
    TorchName(BLOCK_KEY + MLP_NORM_KEY, "norm", None, TIMM_BLOCK + r"mlp\.norm"),
    TorchName("Transformer/encoder_norm", "norm", None, r"fc_norm"),
)

FAMILY = Family(
    name="eva02",
    switches={"eva02": _EVA02, **_EVA02_SIZES},
    entries=tuple(_eva02_entries()),
    torch_names=_TORCH_NAMES,
    timm_layout=_timm_layout,
)
