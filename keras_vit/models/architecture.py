"""A Vision Transformer's architecture as one description, `Architecture`: the arguments
`keras_vit.ViT` is built from, checked against each other once, in the form its config
records.

`VisionTransformer(...)` makes one from its keyword arguments, builds its layers from it
and returns it from `get_config`; training and the weights read its names
(`FAMILY_DEFAULTS`, `ARCHITECTURE`, `check_arguments`) to check arguments without a model.
"""

import dataclasses
from typing import Optional

import keras

from keras_vit.layers import posembed
from keras_vit.layers.embedding import POSITION_EMBEDDINGS
from keras_vit.layers.mlp import MLPS
from keras_vit.models import resnet, size
from keras_vit.models.preprocessing import check_preprocessing
from keras_vit.models.variants import VARIANTS, parse_variant
from keras_vit.utils.checks import check_choice, check_in_range, check_positive_int

SIZE_ARGUMENTS = ("patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim")
# The switches of the ViT family (DeiT, DeiT III, registers, DINOv2, CLIP, ...), whose
# defaults (`FAMILY_DEFAULTS`) give the paper's ViT. `get_config` records one only when it
# differs, so the configs (and `.keras` files) of the paper's models stay as keras-vit
# wrote them before these existed.
FAMILY_SWITCHES = (
    "distilled", "distillation_head", "no_embed_class", "layer_scale_init",
    "layer_norm_epsilon", "num_registers", "mlp", "pre_norm", "quick_gelu", "patch_bias",
    "projection_dim", "rope", "rope_reference_grid", "mlp_norm", "fc_norm", "naflex",
    "images_per_row",
)
BOOLEAN_SWITCHES = ("distilled", "distillation_head", "no_embed_class", "pre_norm", "quick_gelu",
                    "patch_bias", "mlp_norm", "fc_norm", "naflex")
RATE_ARGUMENTS = ("dropout_rate", "attention_dropout_rate", "drop_path_rate")
CLASSIFIERS = ("token", "gap", "token_gap", "map", "avg")
# The classifiers that put a class token in front of the patches.
CLASS_TOKEN_CLASSIFIERS = ("token", "token_gap", "avg")
# What fixes the shapes of the weights (with the family switches): the arguments a
# checkpoint or a run decides, whatever a recipe or a caller says.
ARCHITECTURE = ("variant", "patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim",
                "resnet_stages")
# `ViT`'s arguments that are the Keras model's, not its architecture.
MODEL_ARGUMENTS = ("name", "dtype", "quantized")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The architecture arguments of a `keras_vit.ViT` (see `VisionTransformer` for
    each), checked on construction and normalised to the form its config records.

    Construction raises a `ValueError` naming the first bad argument, or the two that
    contradict each other. A `variant` gives the sizes that are None; `image_size` and
    `rope_reference_grid` become `(rows, cols)` pairs, `data_format` the Keras
    default, `preprocessing` its checked form.

    Example:

    >>> arch = Architecture("B/16", image_size=384, num_layers=2)
    >>> arch.hidden_dim, arch.num_layers, arch.image_size, arch.grid_size
    (768, 2, (384, 384), (24, 24))
    >>> Architecture(patch_size=16, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8,
    ...              image_size=100)
    Traceback (most recent call last):
    ...
    ValueError: image_size (100, 100) is not divisible by patch_size 16: use a multiple of 16.
    """

    variant: Optional[str] = None
    image_size: object = 224
    dynamic_image_size: bool = False
    dynamic_image_pad: bool = False
    pos_interpolation: str = "bicubic_antialias"
    num_classes: int = 1000
    patch_size: Optional[int] = None
    hidden_dim: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    mlp_dim: Optional[int] = None
    resnet_stages: Optional[tuple] = None
    classifier: str = "token"
    representation_size: Optional[int] = None
    pos_embedding: str = "learned"
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    gelu_approximate: bool = False
    include_top: bool = True
    pooling: bool = True
    channels: int = 3
    head_bias_init: float = 0.0
    distilled: bool = False
    distillation_head: bool = True
    no_embed_class: bool = False
    layer_scale_init: Optional[float] = None
    layer_norm_epsilon: float = 1e-6
    num_registers: int = 0
    mlp: str = "gelu"
    data_format: Optional[str] = None
    preprocessing: Optional[dict] = None
    pre_norm: bool = False
    quick_gelu: bool = False
    patch_bias: bool = True
    projection_dim: Optional[int] = None
    rope: object = False
    rope_reference_grid: Optional[tuple] = None
    mlp_norm: bool = False
    fc_norm: bool = False
    naflex: bool = False
    images_per_row: Optional[int] = None
    remat: bool = False

    def __post_init__(self):
        def normalise(name, value):  # frozen: set once, here
            object.__setattr__(self, name, value)

        data_format = self.data_format or keras.config.image_data_format()
        if data_format != "channels_last":
            raise ValueError(
                f"data_format {data_format!r} is not supported: keras-vit models take "
                "channels_last (NHWC) images; transpose channels_first data with "
                "keras.ops.transpose(images, (0, 2, 3, 1))."
            )
        normalise("data_format", data_format)
        sizes = {name: getattr(self, name) for name in SIZE_ARGUMENTS}
        for name, value in resolve_architecture(self.variant, self.resnet_stages, **sizes).items():
            normalise(name, value)
        check_arguments(
            {name: getattr(self, name) for name in (*SIZE_ARGUMENTS, *RATE_ARGUMENTS, "remat")}
        )
        check_choice("classifier", self.classifier, CLASSIFIERS)
        check_choice("pos_embedding", self.pos_embedding, POSITION_EMBEDDINGS)
        check_choice("pos_interpolation", self.pos_interpolation, posembed.INTERPOLATIONS)
        self._check_family()
        if self.rope_reference_grid is not None:
            normalise("rope_reference_grid", _pair(self.rope_reference_grid, "rope_reference_grid"))
        if self.quick_gelu and self.gelu_approximate:
            raise ValueError(
                "quick_gelu=True replaces GELU, which gelu_approximate=True sets: pass one of them."
            )
        normalise("dynamic_image_size", bool(self.dynamic_image_size))
        normalise("dynamic_image_pad", bool(self.dynamic_image_pad))
        if self.dynamic_image_pad and not self.dynamic_image_size:
            raise ValueError(
                "dynamic_image_pad=True pads images of any size, which needs "
                "dynamic_image_size=True: pass both."
            )
        height, width = _pair(self.image_size, "image_size")
        normalise("image_size", (height, width))
        if height % self.stride or width % self.stride:
            raise ValueError(
                f"image_size {(height, width)} is not divisible by patch_size {self.stride}"
                + ("" if self.resnet_stages is None
                   else " (ResNet trunk stride times feature-map patch size)")
                + f": use a multiple of {self.stride}."
            )
        if self.distilled and self.distillation_head and self.representation_size:
            raise ValueError(
                "representation_size (pre_logits) takes one pooled token, but distilled=True "
                "classifies two: pass distillation_head=False, or no representation_size."
            )
        if self.preprocessing is not None:
            normalise("preprocessing", check_preprocessing(self.preprocessing))
        if self.images_per_row is not None:
            if not self.naflex:
                raise ValueError(
                    f"images_per_row={self.images_per_row!r} packs NaFlex images into a row, "
                    "which needs naflex=True: pass both, or leave images_per_row None."
                )
            normalise("images_per_row", check_positive_int("images_per_row", self.images_per_row))
        if self.naflex:
            self._check_naflex()

    def _check_naflex(self):
        """Refuses what a NaFlex model (already cut patches of several grids) cannot have."""
        for name, given, why in (
            ("dynamic_image_size", self.dynamic_image_size, "takes images"),
            ("resnet_stages", self.resnet_stages is not None, "cuts a trunk's feature map"),
            ("remat", self.remat, "rematerialises blocks called with the tokens alone"),
            ("distilled", self.distilled and self.distillation_head, "pools two tokens"),
        ):
            if given:
                raise ValueError(
                    f"naflex=True takes patches already cut, but {name}={getattr(self, name)!r} "
                    f"{why}: pass one of them."
                )

    def _check_family(self):
        """Checks the family switches, against each other and `classifier`."""
        for name in BOOLEAN_SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        classifier = self.classifier
        if self.distilled and classifier not in CLASS_TOKEN_CLASSIFIERS:
            raise ValueError(
                f"distilled=True adds a distillation token after the class token, but "
                f"classifier={classifier!r} has none: pass classifier='token'."
            )
        if not self.distillation_head and not self.distilled:
            raise ValueError(
                "distillation_head=False leaves out the head of a distillation token, which "
                "needs distilled=True: pass both, or neither."
            )
        if self.no_embed_class and classifier not in CLASS_TOKEN_CLASSIFIERS:
            raise ValueError(
                f"no_embed_class=True leaves the class token out of the position embedding, "
                f"but classifier={classifier!r} has none: pass classifier='token'."
            )
        scale = self.layer_scale_init
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
            raise ValueError(
                f"layer_scale_init must be None or a number such as 1e-6, got {scale!r}."
            )
        if self.projection_dim is not None:
            check_positive_int("projection_dim", self.projection_dim)
        epsilon = self.layer_norm_epsilon
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
            raise ValueError(f"layer_norm_epsilon must be a positive number, got {epsilon!r}.")
        count = self.num_registers
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"num_registers must be a whole number, 0 or more, got {count!r}.")
        if count and classifier not in CLASS_TOKEN_CLASSIFIERS:
            raise ValueError(
                f"num_registers={count} puts register tokens after the class token, but "
                f"classifier={classifier!r} has none: pass classifier='token'."
            )
        check_choice("mlp", self.mlp, MLPS)
        rope = self.rope
        if not isinstance(rope, bool) and not (
            isinstance(rope, dict) and {"class_name", "config"} <= rope.keys()
        ):
            raise ValueError(
                "rope must be True, False or a rotary embedding layer's config "
                f"(keras.saving.serialize_keras_object(layer)), got {rope!r}."
            )
        if self.rope_reference_grid is not None and rope is not True:
            raise ValueError(
                "rope_reference_grid scales EVA-02's rotary position embedding, which needs "
                f"rope=True (got rope={rope!r}; a rope layer's config holds its own "
                "settings): pass both, or neither."
            )

    @property
    def stride(self):
        """The input pixels per patch side (`input_stride`)."""
        return input_stride(self.patch_size, self.resnet_stages)

    @property
    def grid_size(self):
        """The `(rows, cols)` patch grid of `image_size`."""
        return tuple(side // self.stride for side in self.image_size)

    def parameter_count(self, num_classes=None):
        """Parameters of the model (`keras_vit.models.size.parameter_count`: the
        hybrids' trunk and the families' extra parts left out), with `num_classes`
        outputs (default: its head's, none without one).

        Example:

        >>> Architecture("B/16").parameter_count()
        86567656
        """
        if num_classes is None:
            num_classes = self.num_classes if self.include_top else 0
        rows, cols = self.grid_size
        return size.parameter_count(
            tokens=rows * cols + 1,
            patch_values=0 if self.resnet_stages else self.patch_size ** 2 * self.channels,
            hidden_dim=self.hidden_dim, mlp_dim=self.mlp_dim, num_layers=self.num_layers,
            num_classes=num_classes,
        )

    def activation_values(self, patches=None):
        """Values one image's forward pass keeps for the backward pass
        (`keras_vit.models.size.activation_values`), with `remat` as set; with `patches`,
        one row's of that many patch tokens (a NaFlex batch's padded or packed row, each
        of its `images_per_row` images with its own prefix token)."""
        rows, cols = self.grid_size
        tokens = rows * cols + 1 if patches is None else patches + (self.images_per_row or 1)
        return size.activation_values(
            tokens=tokens, hidden_dim=self.hidden_dim, mlp_dim=self.mlp_dim,
            num_heads=self.num_heads, num_layers=self.num_layers, remat=self.remat,
        )

    def get_config(self):
        """The arguments as `keras_vit.ViT`'s config records them: every one, but the
        family switches only where they differ from `FAMILY_DEFAULTS`, and `remat` and
        `preprocessing` only when set (configs without them stay as they were).

        Example:

        >>> config = Architecture("Ti/16", num_registers=4).get_config()
        >>> config["hidden_dim"], config["num_registers"], "distilled" in config
        (192, 4, False)
        """
        config = dataclasses.asdict(self)
        for name in FAMILY_SWITCHES:
            if config[name] == FAMILY_DEFAULTS[name]:
                del config[name]
        for name in ("remat", "preprocessing"):
            if not config[name]:
                del config[name]
        return config


# The family switches' defaults: the paper's ViT.
FAMILY_DEFAULTS = {
    field.name: field.default for field in dataclasses.fields(Architecture)
    if field.name in FAMILY_SWITCHES
}


def check_arguments(arguments):
    """Raises `ValueError` naming the first entry of `arguments` (keyword arguments of
    `ViT`) that `ViT` does not take, or whose value is not of the kind it needs.

    Example:

    >>> check_arguments(dict(num_layers=2, dropout_rate=0.1))
    >>> check_arguments(dict(num_layers="abc"))
    Traceback (most recent call last):
    ...
    ValueError: num_layers must be a positive integer, got 'abc'.
    """
    known = [
        field.name for field in dataclasses.fields(Architecture) if field.name != "variant"
    ] + list(MODEL_ARGUMENTS)
    for name, value in arguments.items():
        if name not in known:
            raise ValueError(f"ViT takes no argument {name!r}; its arguments: {', '.join(known)}.")
        if value is None:
            continue
        if name in SIZE_ARGUMENTS:
            check_positive_int(name, value)
        if name in RATE_ARGUMENTS:
            check_in_range(name, value, "[0, 1)")
        if name == "remat" and not isinstance(value, bool):  # "false" would switch it on
            raise ValueError(f"remat must be True or False, got {value!r}.")


def resolve_architecture(variant=None, resnet_stages=None, **sizes):
    """The architecture `ViT(variant, resnet_stages=..., **sizes)` builds: the variant's
    (`parse_variant`), with the `SIZE_ARGUMENTS` in `sizes` that are not None in place of
    its own; a `ValueError` names those missing without a variant.

    Example:

    >>> resolve_architecture("B/16", num_layers=2)
    {'patch_size': 16, 'hidden_dim': 768, 'mlp_dim': 3072, 'num_heads': 12, 'num_layers': 2, 'resnet_stages': None}
    """
    arch = parse_variant(variant) if variant is not None else {"resnet_stages": None}
    arch.update({k: v for k, v in sizes.items() if v is not None})
    if resnet_stages is not None:
        arch["resnet_stages"] = tuple(resnet_stages)
    missing = [k for k in SIZE_ARGUMENTS if k not in arch]
    if missing:
        raise ValueError(
            f"Without a variant, ViT needs {', '.join(missing)}; or pass a variant, "
            f"one of {', '.join(VARIANTS)}."
        )
    return arch


def input_stride(patch_size, resnet_stages=None):
    """The input pixels per patch side: the patch size, times a hybrid trunk's stride.

    Example:

    >>> input_stride(16), input_stride(1, (3, 4, 9))
    (16, 16)
    """
    return patch_size if resnet_stages is None else patch_size * resnet.trunk_stride(resnet_stages)


def _pair(size, name):
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and s > 0 for s in pair):
        raise ValueError(f"{name} must be a positive int or (height, width), got {size!r}.")
    return pair
