"""DeiT, its distilled form and DeiT III: timm's copies of Facebook's files, HF
transformers' `DeiT*` models and timm's DeiT names.

Registry sources: `fb_in1k`, `fb_in22k_ft_in1k` (DeiT, DeiT III): timm's safetensors
copies of Facebook's files (timm `deit.py`: `hf_hub_id='timm/'`, architectures,
resolutions), with the top-1 that facebookresearch/deit reports (`README_deit.md`,
`README_revenge.md`; none for DeiT III's medium model, which it does not list), and the
preprocessing of timm's `pretrained_cfg` (ImageNet mean and std, bicubic, `crop_pct`).
"""

from keras_vit.families.family import (
    IMAGENET1K_CLASSES,
    TIMM_HUB,
    Family,
    TorchName,
    WeightsEntry,
)
from keras_vit.models.preprocessing import IMAGENET_MEAN, IMAGENET_STD

_DEIT_MEDIUM = dict(patch_size=16, hidden_dim=512, mlp_dim=2048, num_heads=8, num_layers=12)
_DISTILLED = dict(distilled=True)
_DEIT3 = dict(no_embed_class=True, layer_scale_init=1e-6)  # timm deit.py, every deit3_*
# (timm architecture, variant (None: _DEIT_MEDIUM), resolution, switches,
#  {tag: reported top-1 or None})
_DEIT = [
    ("deit_tiny_patch16_224", "Ti/16", 224, {}, {"fb_in1k": 72.2}),
    ("deit_small_patch16_224", "S/16", 224, {}, {"fb_in1k": 79.9}),
    ("deit_base_patch16_224", "B/16", 224, {}, {"fb_in1k": 81.8}),
    ("deit_base_patch16_384", "B/16", 384, {}, {"fb_in1k": 82.9}),
    ("deit_tiny_distilled_patch16_224", "Ti/16", 224, _DISTILLED, {"fb_in1k": 74.5}),
    ("deit_small_distilled_patch16_224", "S/16", 224, _DISTILLED, {"fb_in1k": 81.2}),
    ("deit_base_distilled_patch16_224", "B/16", 224, _DISTILLED, {"fb_in1k": 83.4}),
    ("deit_base_distilled_patch16_384", "B/16", 384, _DISTILLED, {"fb_in1k": 85.2}),
    ("deit3_small_patch16_224", "S/16", 224, _DEIT3, {"fb_in1k": 81.4, "fb_in22k_ft_in1k": 83.1}),
    ("deit3_small_patch16_384", "S/16", 384, _DEIT3, {"fb_in1k": 83.4, "fb_in22k_ft_in1k": 84.8}),
    ("deit3_medium_patch16_224", None, 224, _DEIT3, {"fb_in1k": None, "fb_in22k_ft_in1k": None}),
    ("deit3_base_patch16_224", "B/16", 224, _DEIT3, {"fb_in1k": 83.8, "fb_in22k_ft_in1k": 85.7}),
    ("deit3_base_patch16_384", "B/16", 384, _DEIT3, {"fb_in1k": 85.0, "fb_in22k_ft_in1k": 86.7}),
    ("deit3_large_patch16_224", "L/16", 224, _DEIT3, {"fb_in1k": 84.9, "fb_in22k_ft_in1k": 87.0}),
    ("deit3_large_patch16_384", "L/16", 384, _DEIT3, {"fb_in1k": 85.8, "fb_in22k_ft_in1k": 87.7}),
    ("deit3_huge_patch14_224", "H/14", 224, _DEIT3, {"fb_in1k": 85.2, "fb_in22k_ft_in1k": 87.2}),
]


def _deit_crop(image_size, tag):
    """timm's `crop_pct` of a DeiT checkpoint (deit.py `_cfg`: 0.9, but 1.0 for the 384 px
    files and DeiT III's ImageNet-21k fine-tunes)."""
    return 1.0 if image_size == 384 or tag == "fb_in22k_ft_in1k" else 0.9


def _deit_entries():
    entries = []
    for arch, variant, image_size, switches, tags in _DEIT:
        for tag, top1 in tags.items():
            name = f"{arch}.{tag}"
            entries.append(WeightsEntry(
                name=name,
                url=TIMM_HUB.format(name=name),
                variant=variant,
                image_size=image_size,
                num_classes=IMAGENET1K_CLASSES,
                labels="imagenet1k",
                pretraining="ImageNet-21k" if tag == "fb_in22k_ft_in1k" else "ImageNet-1k",
                finetuning="ImageNet-1k" if tag == "fb_in22k_ft_in1k" else None,
                top1=top1,
                model_args=dict(switches, **({} if variant else _DEIT_MEDIUM)),
                mean=IMAGENET_MEAN,
                std=IMAGENET_STD,
                interpolation="bicubic",
                crop_fraction=_deit_crop(image_size, tag),
            ))
    return entries



# DeiT's distillation token `dist` and head `head_dist` beside the official keys;
# DeiTForImageClassificationWithTeacher's heads are `cls_classifier` and
# `distillation_classifier`.
_TORCH_NAMES = (
    TorchName("dist", "copy", r"embeddings\.distillation_token", r"dist_token"),
    TorchName("head", "dense", r"cls_classifier", None),
    TorchName("head_dist", "dense", r"distillation_classifier", r"head_dist"),
)

FAMILY = Family(
    name="deit",
    switches={"deit": {}, "distilled": _DISTILLED, "deit3": _DEIT3},
    entries=tuple(_deit_entries()),
    hf_architectures={
        "DeiTForImageClassificationWithTeacher": _DISTILLED,
        "DeiTForImageClassification": dict(_DISTILLED, distillation_head=False),
        "DeiTModel": dict(_DISTILLED, distillation_head=False, include_top=False),
    },
    hf_model_types={"DeiT": ("deit",)},
    hf_prefixes=("deit",),
    torch_names=_TORCH_NAMES,
)
