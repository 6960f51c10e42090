"""The paper's ViT: vit_jax's and big_vision's checkpoints (the original 2020 files and
AugReg's, as timm tags them), HF transformers' `ViT*` models and timm's ViT names.

Registry sources:

- `orig_in21k`, `orig_in21k_ft_in1k`: the paper's files, `gs://vit_models/imagenet21k/`
  and `gs://vit_models/imagenet21k+imagenet2012/` (vision_transformer README; sizes from
  the `gsutil ls` listing in its `vit_jax.ipynb`).
- `augreg_in21k`, `augreg_in21k_ft_in1k`: the AugReg files behind timm's tags of these
  names (timm `vision_transformer.py`, `vision_transformer_hybrid.py`).
- `augreg_recommended_in21k`, `augreg_recommended_in21k_ft_in1k`: the AugReg checkpoints
  the authors recommend per variant and their ImageNet top-1 (vision_transformer README
  table; B/8 from the same table in `vit_jax_augreg.ipynb`). Where the file equals
  timm's, both names give the same cached file.

Their preprocessing is vit_jax's (`keras_vit.models.preprocessing.DEFAULT`). The torch
names here are the ones every family's HF and timm files share (the patch embedding,
the blocks, the final norm, the head); the other families add theirs.
"""

import dataclasses
import re

from keras_vit.families.family import (
    ATTENTION_KEY,
    BLOCK_KEY,
    HF_LAYER,
    IMAGENET1K_CLASSES,
    IMAGENET21K_CLASSES,
    OFFICIAL_BASE,
    POS_KEY,
    TIMM_BLOCK,
    Family,
    TorchName,
    WeightsEntry,
)
from keras_vit.models.variants import parse_variant

# ---------------------------------------------------------------------------
# AugReg file names.

_AUGREG = re.compile(
    r"(?P<name>[A-Za-z0-9_]+?)-(?P<ds>i1k|i21k)-(?P<epochs>\d+)ep-lr_(?P<lr>[\d.]+)"
    r"-aug_(?P<aug>[a-z0-9]+)-wd_(?P<wd>[\d.]+)-do_(?P<do>[\d.]+)-sd_(?P<sd>[\d.]+)"
    r"(?:--(?P<adapt_ds>[a-z0-9_]+)-steps_(?P<steps>\d+)k-lr_(?P<adapt_lr>[\d.]+)"
    r"-res_(?P<res>\d+))?(?:\.npz)?"
)
# Class counts of the fine-tuning data sets in AugReg's index.csv (kitti's task is left
# out: its head width is read from the file).
_ADAPT_CLASSES = {"imagenet2012": 1000, "cifar100": 100, "oxford_iiit_pet": 37, "resisc45": 45}


@dataclasses.dataclass(frozen=True)
class AugRegName:
    """The fields of an AugReg checkpoint file name.

    `adapt_ds`, `adapt_steps_k`, `adapt_lr` and `adapt_resolution` are None for a
    pretrained (not fine-tuned) checkpoint.
    """

    model: str
    dataset: str
    epochs: int
    lr: float
    aug: str
    wd: float
    do: float
    sd: float
    adapt_ds: str | None = None
    adapt_steps_k: int | None = None
    adapt_lr: float | None = None
    adapt_resolution: int | None = None

    @property
    def variant(self):
        """The `keras_vit.ViT` variant: `B_16` is `"B/16"`, `R50_L_32` `"R50+L/32"`."""
        *trunk, size, patch = self.model.split("_")
        return ("+".join(["_".join(trunk), size]) if trunk else size) + f"/{patch}"

    def model_args(self):
        """`variant`, `image_size` and `num_classes` of the checkpoint (None if unknown)."""
        if self.adapt_ds is None:
            classes = IMAGENET21K_CLASSES if self.dataset == "i21k" else IMAGENET1K_CLASSES
        else:
            classes = _ADAPT_CLASSES.get(self.adapt_ds)
        return dict(
            variant=self.variant,
            image_size=self.adapt_resolution or 224,
            num_classes=classes,
        )


def parse_augreg_name(filename):
    """Parses an AugReg file name (or URL) into an `AugRegName`; anything else is a ValueError.

    Example:

    >>> name = parse_augreg_name("R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1"
    ...                          "--imagenet2012-steps_20k-lr_0.01-res_384.npz")
    >>> name.variant, name.aug, name.model_args()["image_size"]
    ('R50+L/32', 'medium1', 384)
    """
    base = filename.rsplit("/", 1)[-1]
    match = _AUGREG.fullmatch(base)
    if not match:
        raise ValueError(
            f"{base!r} is not an AugReg file name: expected {{name}}-{{ds}}-{{epochs}}ep-"
            "lr_{lr}-aug_{aug}-wd_{wd}-do_{do}-sd_{sd}[--{adapt_ds}-steps_{N}k-lr_{lr}-"
            "res_{res}].npz."
        )
    g = match.groupdict()
    adapted = g["adapt_ds"] is not None
    name = AugRegName(
        model=g["name"], dataset=g["ds"], epochs=int(g["epochs"]), lr=float(g["lr"]),
        aug=g["aug"], wd=float(g["wd"]), do=float(g["do"]), sd=float(g["sd"]),
        adapt_ds=g["adapt_ds"],
        adapt_steps_k=int(g["steps"]) if adapted else None,
        adapt_lr=float(g["adapt_lr"]) if adapted else None,
        adapt_resolution=int(g["res"]) if adapted else None,
    )
    try:
        parse_variant(name.variant)
    except ValueError:
        raise ValueError(f"{base!r} names the unknown model {name.model!r}.") from None
    return name


# ---------------------------------------------------------------------------
# The official checkpoints.

_JAX = dict(gelu_approximate=True)  # vit_jax's flax nn.gelu is the tanh approximation
_ARCH = {  # timm architecture prefix -> variant
    "vit_tiny_patch16": "Ti/16",
    "vit_small_patch16": "S/16",
    "vit_small_patch32": "S/32",
    "vit_base_patch8": "B/8",
    "vit_base_patch16": "B/16",
    "vit_base_patch32": "B/32",
    "vit_large_patch16": "L/16",
    "vit_large_patch32": "L/32",
    "vit_huge_patch14": "H/14",
    "vit_tiny_r_s16_p8": "R+Ti/16",
    "vit_small_r26_s32": "R26+S/32",
    "vit_base_r50_s16": "R50+B/16",
    "vit_large_r50_s32": "R50+L/32",
}
_HIDDEN = {"Ti": 192, "S": 384, "B": 768, "L": 1024, "H": 1280}


def _augreg(arch, tag, filename, top1=None, size_mib=None):
    args = parse_augreg_name(filename).model_args()
    in21k = args["num_classes"] == IMAGENET21K_CLASSES
    return WeightsEntry(
        name=f"{arch}_{args['image_size']}.{tag}",
        url=f"{OFFICIAL_BASE}augreg/{filename}",
        variant=_ARCH[arch],
        image_size=args["image_size"],
        num_classes=args["num_classes"],
        labels="imagenet21k" if in21k else "imagenet1k",
        finetuning=None if in21k else "ImageNet-1k",
        top1=top1,
        size_mib=size_mib,
        activation="sigmoid" if in21k else "softmax",
        model_args=dict(_JAX),
    )


def _original(arch, image_size, path, size_mib, top1=None):
    variant = _ARCH[arch]
    in21k = path.startswith("imagenet21k/")
    width = _HIDDEN[variant.split("+")[-1].split("/")[0]]
    return WeightsEntry(
        name=f"{arch}_{image_size}.orig_in21k" + ("" if in21k else "_ft_in1k"),
        url=OFFICIAL_BASE + path,
        variant=variant,
        image_size=image_size,
        num_classes=IMAGENET21K_CLASSES if in21k else IMAGENET1K_CLASSES,
        labels="imagenet21k" if in21k else "imagenet1k",
        finetuning=None if in21k else "ImageNet-1k",
        top1=top1,
        size_mib=size_mib,
        activation="sigmoid" if in21k else "softmax",
        # The 2020 in21k files keep the representation layer (pre_logits, width D);
        # the fine-tunes have none (vision_transformer README).
        model_args=dict(_JAX, representation_size=width if in21k else None),
    )


_GIB = 1024
_OFFICIAL = [
    # The paper's ImageNet-21k files (21843 classes, with pre_logits), 224 px.
    _original("vit_base_patch16", 224, "imagenet21k/ViT-B_16.npz", 393.69),
    _original("vit_base_patch32", 224, "imagenet21k/ViT-B_32.npz", 400.01),
    _original("vit_large_patch16", 224, "imagenet21k/ViT-L_16.npz", 1.22 * _GIB),
    _original("vit_large_patch32", 224, "imagenet21k/ViT-L_32.npz", 1.23 * _GIB),
    _original("vit_huge_patch14", 224, "imagenet21k/ViT-H_14.npz", 2.46 * _GIB),
    _original("vit_base_r50_s16", 224, "imagenet21k/R50+ViT-B_16.npz", 439.85),
    # Their ImageNet fine-tunes: 384 px, and "-224" at 224 px (README: 81.2% and 82.7%).
    _original("vit_base_patch16", 384, "imagenet21k+imagenet2012/ViT-B_16.npz", 331.4),
    _original("vit_base_patch32", 384, "imagenet21k+imagenet2012/ViT-B_32.npz", 336.89),
    _original("vit_large_patch16", 384, "imagenet21k+imagenet2012/ViT-L_16.npz", 1.14 * _GIB),
    _original("vit_large_patch32", 384, "imagenet21k+imagenet2012/ViT-L_32.npz", 1.14 * _GIB),
    _original("vit_base_r50_s16", 384, "imagenet21k+imagenet2012/R50+ViT-B_16.npz", 377.57),
    _original("vit_base_patch16", 224, "imagenet21k+imagenet2012/ViT-B_16-224.npz", 330.29, 81.2),
    _original(
        "vit_large_patch16", 224, "imagenet21k+imagenet2012/ViT-L_16-224.npz", 1.13 * _GIB, 82.7
    ),
]

_TIMM_AUGREG = [  # timm's augreg_in21k / augreg_in21k_ft_in1k tags
    ("vit_tiny_patch16", "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", ("lr_0.03-res_224", "lr_0.03-res_384")),
    ("vit_small_patch32", "S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", ("lr_0.03-res_224", "lr_0.03-res_384")),
    ("vit_small_patch16", "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", ("lr_0.03-res_224", "lr_0.03-res_384")),
    ("vit_base_patch32", "B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0", ("lr_0.03-res_224",)),
    ("vit_base_patch32", None, ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384",)),
    ("vit_base_patch16", "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", ("lr_0.01-res_224", "lr_0.01-res_384")),
    ("vit_base_patch8", "B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", ("lr_0.01-res_224",)),
    ("vit_large_patch16", "L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", ("lr_0.01-res_224", "lr_0.01-res_384")),
    ("vit_tiny_r_s16_p8", "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", ("lr_0.03-res_224", "lr_0.03-res_384")),
    ("vit_small_r26_s32", "R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0", ()),
    ("vit_small_r26_s32", None, (
        "R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.03-res_224",
        "R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384",
    )),
    ("vit_large_r50_s32", "R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0", ()),
    ("vit_large_r50_s32", None, (
        "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_224",
        "R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_384",
    )),
]

# The authors' recommendation per variant (vision_transformer README; B/8 from
# vit_jax_augreg.ipynb): pretrained file, its size (MiB), the ImageNet fine-tune's
# suffix and its reported top-1 (%).
_RECOMMENDED = [
    ("vit_large_patch16", "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0", 1243, "lr_0.01-res_384", 85.59),
    ("vit_base_patch16", "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", 391, "lr_0.03-res_384", 85.49),
    ("vit_small_patch16", "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", 115, "lr_0.03-res_384", 83.73),
    ("vit_large_r50_s32", "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", 1337, "lr_0.01-res_384", 85.99),
    ("vit_small_r26_s32", "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", 170, "lr_0.01-res_384", 83.85),
    ("vit_tiny_patch16", "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", 37, "lr_0.03-res_384", 78.22),
    ("vit_base_patch32", "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", 398, "lr_0.01-res_384", 83.59),
    ("vit_small_patch32", "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0", 118, "lr_0.01-res_384", 79.58),
    ("vit_tiny_r_s16_p8", "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", 40, "lr_0.03-res_384", 75.40),
    ("vit_base_patch8", "B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0", None, "lr_0.03-res_224", 85.578),
]


def _official_entries():
    entries = list(_OFFICIAL)
    recommended = {}
    for arch, pretrained, size, suffix, top1 in _RECOMMENDED:
        finetuned = f"{pretrained}--imagenet2012-steps_20k-{suffix}.npz"
        recommended[finetuned] = (size, top1)
        recommended[f"{pretrained}.npz"] = (size, None)
        entries.append(_augreg(arch, "augreg_recommended_in21k", f"{pretrained}.npz", None, size))
        entries.append(_augreg(arch, "augreg_recommended_in21k_ft_in1k", finetuned, top1))
    for arch, pretrained, finetunes in _TIMM_AUGREG:
        if pretrained is not None:
            size = recommended.get(f"{pretrained}.npz", (None,))[0]
            entries.append(_augreg(arch, "augreg_in21k", f"{pretrained}.npz", None, size))
        for finetune in finetunes:
            filename = (
                f"{finetune}.npz" if "--" in finetune
                else f"{pretrained}--imagenet2012-steps_20k-{finetune}.npz"
            )
            top1 = recommended.get(filename, (None, None))[1]
            entries.append(_augreg(arch, "augreg_in21k_ft_in1k", filename, top1))
    return entries



# ---------------------------------------------------------------------------
# HF transformers and timm names of the parts every family's files share.

# official module, conversion, HF transformers name, timm name (None: not in that format).
# timm's NaFlexVit holds its tokens under `embeds.`; its EVA blocks (rope) name their
# layer scales `gamma_1`, `gamma_2`.
_TORCH_NAMES = (
    TorchName("cls", "copy", r"embeddings\.cls_token", r"(?:embeds\.)?cls_token"),
    TorchName(POS_KEY, "copy", r"embeddings\.position_embeddings", r"pos_embed"),
    TorchName("embedding", "conv", r"embeddings\.patch_embeddings\.projection",
              r"patch_embed\.proj"),
    TorchName(BLOCK_KEY + "LayerNorm_0", "norm", HF_LAYER + "layernorm_before",
              TIMM_BLOCK + "norm1"),
    TorchName(ATTENTION_KEY + "/{name}", "heads_in",
              HF_LAYER + r"attention\.attention\.(?P<name>query|key|value)", None),
    TorchName(ATTENTION_KEY, "qkv", None, TIMM_BLOCK + r"attn\.qkv"),
    TorchName(ATTENTION_KEY + "/out", "heads_out", HF_LAYER + r"attention\.output\.dense",
              TIMM_BLOCK + r"attn\.proj"),
    # timm's Block names its layer scales (DeiT III's and DINOv2's) `ls1`, `ls2`: under
    # `LayerScale_{attention,mlp}` beyond vit_jax's keys.
    TorchName(BLOCK_KEY + "LayerScale_attention/scale", "scale", None,
              TIMM_BLOCK + r"(?:ls1\.gamma|gamma_1)"),
    TorchName(BLOCK_KEY + "LayerNorm_2", "norm", HF_LAYER + "layernorm_after",
              TIMM_BLOCK + "norm2"),
    TorchName(BLOCK_KEY + "MlpBlock_3/Dense_0", "dense", HF_LAYER + r"intermediate\.dense",
              TIMM_BLOCK + r"mlp\.fc1"),
    TorchName(BLOCK_KEY + "MlpBlock_3/Dense_1", "dense", HF_LAYER + r"output\.dense",
              TIMM_BLOCK + r"mlp\.fc2"),
    TorchName(BLOCK_KEY + "LayerScale_mlp/scale", "scale", None,
              TIMM_BLOCK + r"(?:ls2\.gamma|gamma_2)"),
    TorchName("Transformer/encoder_norm", "norm", r"layernorm", r"norm"),
    # ViTModel's pooler is the representation layer: Dense + tanh on the class token.
    TorchName("pre_logits", "dense", r"pooler\.dense", None),
    TorchName("head", "dense", r"classifier", r"head"),
)
# transformers 5.x module names (in memory); its files keep the older names.
_HF_RENAMES = (
    (r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
    (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
    (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
)

FAMILY = Family(
    name="vit",
    switches={"vit": {}, "vit_jax": _JAX},
    entries=tuple(_official_entries()),
    # `ViTModel` outputs `pooler_output` (the pooler is `pre_logits`), or the tokens
    # without one.
    hf_architectures={"ViTForImageClassification": {}, "ViTModel": dict(include_top=False)},
    hf_model_types={"ViT": ("vit",)},
    hf_prefixes=("vit",),
    hf_renames=_HF_RENAMES,
    torch_names=_TORCH_NAMES,
)
