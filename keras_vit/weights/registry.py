"""The registry of official ViT checkpoints: names, files and the model each one needs.

Each `WeightsEntry` names one released file (`url`), the `keras_vit.ViT` arguments that
hold it, its label set and pretraining data, and the ImageNet top-1 its release reports.
Names follow timm (`{architecture}_{resolution}.{tag}`); where timm has the same tag the
entry is timm's file. Sources:

- `orig_in21k`, `orig_in21k_ft_in1k`: the paper's files, `gs://vit_models/imagenet21k/`
  and `gs://vit_models/imagenet21k+imagenet2012/` (vision_transformer README; sizes from
  the `gsutil ls` listing in its `vit_jax.ipynb`).
- `augreg_in21k`, `augreg_in21k_ft_in1k`: the AugReg files behind timm's tags of these
  names (timm `vision_transformer.py`, `vision_transformer_hybrid.py`).
- `augreg_recommended_in21k`, `augreg_recommended_in21k_ft_in1k`: the AugReg checkpoints
  the authors recommend per variant and their ImageNet top-1 (vision_transformer README
  table; B/8 from the same table in `vit_jax_augreg.ipynb`). Where the file equals
  timm's, both names give the same cached file.
- `fb_in1k`, `fb_in22k_ft_in1k` (DeiT, DeiT III): timm's safetensors copies of
  Facebook's files (timm `deit.py`: `hf_hub_id='timm/'`, architectures, resolutions),
  with the top-1 that facebookresearch/deit reports (`README_deit.md`,
  `README_revenge.md`; none for DeiT III's medium model, which it does not list),
  and the preprocessing of timm's `pretrained_cfg` (ImageNet mean and std, bicubic,
  `crop_pct`).
- `lvd142m` (DINOv2, with and without registers): timm's safetensors copies of Meta's
  backbones, the weights of HF's `facebook/dinov2-{small,base,large,giant}` and
  `facebook/dinov2-with-registers-*` (timm `vision_transformer.py`: architectures,
  518 px, no head, ImageNet mean and std, bicubic, `crop_pct` 1.0). The release reports
  linear-probe accuracies of heads it ships apart, not of these files: no top-1.
- `webli`, `v2_webli` (SigLIP, SigLIP 2), `openai` (CLIP): the image towers of Google's
  and OpenAI's releases (`google/siglip-*`, `google/siglip2-*`, `openai/clip-vit-*` on
  the Hugging Face Hub), as timm's copies (timm `vision_transformer.py`: architectures,
  resolutions). They output the pooled features (SigLIP's MAP head) or the image
  embedding (CLIP's projection) and have no classes (`num_classes` 0). Their
  preprocessing is the release's (its HF image processor): SigLIP's pixels in [-1, 1]
  (mean = std = 0.5), the whole image resized, bicubically (SigLIP) or bilinearly
  (SigLIP 2, as big_vision's `resize`); CLIP's OpenAI mean and std, bicubic, the
  central crop of the resized short side (fraction 1.0). timm's `pretrained_cfg` keeps
  its default 0.9 crop for most of them.
- `mim_in22k`, `mim_m38m` and their `_ft_*` fine-tunes (EVA-02): timm's safetensors
  copies of BAAI's files (timm `eva.py`: architectures, resolutions, classes, OpenAI CLIP
  mean and std, bicubic, `crop_pct`, `crop_mode="squash"` as the whole image resized),
  with the ImageNet-1k top-1 of timm's `results/results-imagenet.csv`.
"""

import dataclasses
import fnmatch
import re

from keras_vit.models.preprocessing import (
    DEFAULT,
    IMAGENET_MEAN,
    IMAGENET_STD,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    check_preprocessing,
)
from keras_vit.models.variants import parse_variant

OFFICIAL_BASE = "https://storage.googleapis.com/vit_models/"
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
    crop_fraction: float | None = DEFAULT["crop_fraction"]

    @property
    def preprocessing(self):
        """The checkpoint's preprocessing dict (`keras_vit.models.preprocessing`)."""
        return check_preprocessing(dict(
            mean=self.mean, std=self.std, interpolation=self.interpolation,
            crop_fraction=self.crop_fraction,
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
# DeiT and DeiT III: timm's copies on the Hugging Face Hub.

TIMM_HUB = "https://huggingface.co/timm/{name}/resolve/main/model.safetensors"
_DEIT_MEDIUM = dict(patch_size=16, hidden_dim=512, mlp_dim=2048, num_heads=8, num_layers=12)
_DEIT3 = dict(no_embed_class=True, layer_scale_init=1e-6)  # timm deit.py, every deit3_*
# (timm architecture, variant (None: _DEIT_MEDIUM), resolution, switches,
#  {tag: reported top-1 or None})
_DEIT = [
    ("deit_tiny_patch16_224", "Ti/16", 224, {}, {"fb_in1k": 72.2}),
    ("deit_small_patch16_224", "S/16", 224, {}, {"fb_in1k": 79.9}),
    ("deit_base_patch16_224", "B/16", 224, {}, {"fb_in1k": 81.8}),
    ("deit_base_patch16_384", "B/16", 384, {}, {"fb_in1k": 82.9}),
    ("deit_tiny_distilled_patch16_224", "Ti/16", 224, dict(distilled=True), {"fb_in1k": 74.5}),
    ("deit_small_distilled_patch16_224", "S/16", 224, dict(distilled=True), {"fb_in1k": 81.2}),
    ("deit_base_distilled_patch16_224", "B/16", 224, dict(distilled=True), {"fb_in1k": 83.4}),
    ("deit_base_distilled_patch16_384", "B/16", 384, dict(distilled=True), {"fb_in1k": 85.2}),
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


# ---------------------------------------------------------------------------
# DINOv2: timm's copies on the Hugging Face Hub (`{arch}.lvd142m`).

# timm vision_transformer.py: layer scale 1e-5; the giant model's SwiGLU MLP, 2/3 of
# mlp_ratio 5.33334 (timm's SwiGLUPacked fc1 packs 2 x 4096).
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
            model_args=dict(switches, layer_scale_init=1e-5, include_top=False),
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            interpolation="bicubic",
            crop_fraction=1.0,
        )
        for arch, variant, switches in _DINOV2
    ]


# SigLIP, SigLIP 2 and CLIP image towers: timm's copies on the Hugging Face Hub.

_SIGLIP = dict(classifier="map", gelu_approximate=True, include_top=False)
_CLIP = dict(pre_norm=True, quick_gelu=True, patch_bias=False, layer_norm_epsilon=1e-5,
             include_top=False)
_SO400M = dict(patch_size=14, hidden_dim=1152, mlp_dim=4304, num_heads=16, num_layers=27)
_SIGLIP_PREPROCESSING = dict(mean=(0.5,) * 3, std=(0.5,) * 3, crop_fraction=None)
_CLIP_PREPROCESSING = dict(mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
                           crop_fraction=1.0)
# (timm name, variant (None: model_args), resolution, switches, data, preprocessing); the
# release's HF id in the comment.
_TOWERS = [
    ("vit_base_patch16_siglip_224.webli", "B/16", 224,  # google/siglip-base-patch16-224
     _SIGLIP, "WebLI", dict(_SIGLIP_PREPROCESSING, interpolation="bicubic")),
    ("vit_so400m_patch14_siglip_384.webli", None, 384,  # google/siglip-so400m-patch14-384
     dict(_SIGLIP, **_SO400M), "WebLI", dict(_SIGLIP_PREPROCESSING, interpolation="bicubic")),
    ("vit_base_patch16_siglip_224.v2_webli", "B/16", 224,  # google/siglip2-base-patch16-224
     _SIGLIP, "WebLI", dict(_SIGLIP_PREPROCESSING, interpolation="bilinear")),
    ("vit_base_patch32_clip_224.openai", "B/32", 224,  # openai/clip-vit-base-patch32
     dict(_CLIP, projection_dim=512), "WIT-400M", _CLIP_PREPROCESSING),
    ("vit_base_patch16_clip_224.openai", "B/16", 224,  # openai/clip-vit-base-patch16
     dict(_CLIP, projection_dim=512), "WIT-400M", _CLIP_PREPROCESSING),
    ("vit_large_patch14_clip_224.openai", "L/14", 224,  # openai/clip-vit-large-patch14
     dict(_CLIP, projection_dim=768), "WIT-400M", _CLIP_PREPROCESSING),
]


def _tower_entries():
    return [
        WeightsEntry(
            name=name, url=TIMM_HUB.format(name=name), variant=variant, image_size=image_size,
            num_classes=0, pretraining=data, model_args=dict(switches), **preprocessing,
        )
        for name, variant, image_size, switches, data, preprocessing in _TOWERS
    ]


# ---------------------------------------------------------------------------
# EVA-02: timm's copies on the Hugging Face Hub (timm `eva.py`).

# Every eva02_* model: SwiGLU of hidden width int(D * 4 * 2 / 3), 2-D rotary position
# embedding scaled to the 224 px grid (`ref_feat_shape=(16, 16)`), the class token left
# out of the mean pooling, and the final norm after it (`global_pool="avg"`, `fc_norm`).
_EVA02 = dict(patch_size=14, num_layers=12, mlp="swiglu", rope=True,
              rope_reference_grid=(16, 16), classifier="avg", fc_norm=True)
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


for _entry in (_official_entries() + _deit_entries() + _dinov2_entries() + _tower_entries()
               + _eva02_entries()):
    register_weights(_entry)
