"""The functional Vision Transformer model and its paper variants."""

import numbers

import keras
from keras import ops

from keras_vit.models import layers as vit_layers
from keras_vit.models import resnet

# name: (hidden_dim, mlp_dim, num_heads, num_layers), vit_jax configs/models.py.
SIZES = {
    "Ti": (192, 768, 3, 12),
    "S": (384, 1536, 6, 12),
    "B": (768, 3072, 12, 12),
    "L": (1024, 4096, 16, 24),
    "H": (1280, 5120, 16, 32),
}
PATCH_SIZES = (8, 14, 16, 32)
# Hybrids, vit_jax configs/models.py: name -> (ResNet stage units, size, patch size
# on the trunk's feature map). The names give the effective patch size.
HYBRIDS = {
    "R+Ti/16": ((), "Ti", 8),
    "R26+S/32": ((2, 2, 2, 2), "S", 1),
    "R26+B/32": ((2, 2, 2, 2), "B", 1),
    "R50+B/16": ((3, 4, 9), "B", 1),
    "R50+L/32": ((3, 4, 6, 3), "L", 1),
}
VARIANTS = tuple(f"{size}/{patch}" for size in SIZES for patch in PATCH_SIZES) + tuple(HYBRIDS)


def parse_variant(variant):
    """Returns the architecture of a variant name such as `"B/16"` as a dict.

    Hybrid names (`"R50+B/16"`) also give `resnet_stages`, and their `patch_size`
    applies to the ResNet feature map.

    Example:

    >>> parse_variant("Ti/16")["hidden_dim"]
    192
    >>> parse_variant("R50+B/16")["resnet_stages"]
    (3, 4, 9)
    """
    if variant not in VARIANTS:
        raise ValueError(
            f"Unknown ViT variant {variant!r}: expected one of {', '.join(VARIANTS)}."
        )
    if variant in HYBRIDS:
        resnet_stages, size, patch = HYBRIDS[variant]
    else:
        resnet_stages = None
        size, patch = variant.split("/")
    hidden_dim, mlp_dim, num_heads, num_layers = SIZES[size]
    return dict(
        patch_size=int(patch),
        hidden_dim=hidden_dim,
        mlp_dim=mlp_dim,
        num_heads=num_heads,
        num_layers=num_layers,
        resnet_stages=resnet_stages,
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """The functional `keras.Model` that `ViT` returns; it compiles with XLA by default.

    It differs from a plain functional model only in what `jit_compile="auto"` (the
    default of `compile`, and what an uncompiled model's `predict` uses) means on
    the TensorFlow backend: XLA for `fit`, `evaluate` and `predict` also on a
    machine with only a CPU, where Keras would turn it off, because keras-vit runs
    faster with it there (see bench/models.py). Under a `tf.distribute` strategy,
    JAX and PyTorch, "auto" means what Keras decides. `compile(jit_compile=False)`
    turns XLA off.
    """

    def _resolve_auto_jit_compile(self):
        # Keras resolves "auto" in this hook, both in compile() and lazily.
        if keras.backend.backend() == "tensorflow" and not self._distribute_strategy:
            import tensorflow as tf

            if not tf.distribute.has_strategy():
                return True
        return super()._resolve_auto_jit_compile()


SIZE_ARGUMENTS = ("patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim")
RATE_ARGUMENTS = ("dropout_rate", "attention_dropout_rate", "drop_path_rate")


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
    import inspect

    known = [name for name in inspect.signature(ViT).parameters if name != "variant"]
    for name, value in arguments.items():
        if name not in known:
            raise ValueError(f"ViT takes no argument {name!r}; its arguments: {', '.join(known)}.")
        if value is None:
            continue
        if name in SIZE_ARGUMENTS and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if name in RATE_ARGUMENTS and (
            isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1
        ):
            raise ValueError(f"{name} must be a number in [0, 1), got {value!r}.")


def _pair(size, name):
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and s > 0 for s in pair):
        raise ValueError(f"{name} must be a positive int or (height, width), got {size!r}.")
    return pair


def ViT(
    variant=None,
    *,
    image_size=224,
    num_classes=1000,
    patch_size=None,
    hidden_dim=None,
    num_layers=None,
    num_heads=None,
    mlp_dim=None,
    resnet_stages=None,
    classifier="token",
    representation_size=None,
    pos_embedding="learned",
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    drop_path_rate=0.0,
    gelu_approximate=False,
    include_top=True,
    pooling=True,
    channels=3,
    head_bias_init=0.0,
    data_format=None,
    name=None,
):
    """Builds a Vision Transformer as a functional `keras.Model` (a `VisionTransformer`).

    The model maps NHWC images scaled to [-1, 1] (see `preprocess`) to logits.

    Args:
        variant: a paper variant `"{Ti,S,B,L,H}/{8,14,16,32}"`, e.g. `"B/16"`, or a
            hybrid: `"R+Ti/16"`, `"R26+S/32"`, `"R26+B/32"`, `"R50+B/16"`, `"R50+L/32"`.
            Without it, `patch_size`, `hidden_dim`, `num_layers`, `num_heads` and
            `mlp_dim` describe a custom model; given with a variant they override it.
        resnet_stages: bottleneck units per stage of a ResNet trunk in front of the
            patch embedding (a custom hybrid), e.g. `(3, 4, 9)`; `()` for the root only.
        image_size: int or `(height, width)`, a multiple of the patch size.
        num_classes: width of the (zero-initialised) classification head.
        classifier: `"token"` (class token) or `"gap"` (mean of the patch tokens).
        representation_size: width of the `pre_logits` Dense + tanh, or None.
        pos_embedding: `"learned"`, `"learned2d"`, `"sincos2d"` or `"none"`.
        dropout_rate, attention_dropout_rate, drop_path_rate: regularisation;
            the drop-path rate grows linearly from 0 to this value with depth.
        gelu_approximate: tanh GELU as the official JAX code (default exact GELU).
        include_top: False returns the pooled features (after `pre_logits`).
        pooling: with `include_top=False`, False returns every output token.
        channels: image channels.
        head_bias_init: initial head bias (the paper uses -10 with sigmoid loss).
        data_format: only `"channels_last"` (the default) is supported.
        name: model name (default `"vit"` or `"vit-{variant}"`).

    Example:

    >>> model = ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...             num_heads=4, mlp_dim=64, num_classes=10)
    >>> tuple(model(keras.ops.zeros((1, 32, 32, 3))).shape)
    (1, 10)
    """
    data_format = data_format or keras.config.image_data_format()
    if data_format != "channels_last":
        raise ValueError(
            f"data_format {data_format!r} is not supported: keras-vit models take "
            "channels_last (NHWC) images; transpose channels_first data with "
            "keras.ops.transpose(images, (0, 2, 3, 1))."
        )
    arch = parse_variant(variant) if variant is not None else {}
    overrides = dict(
        patch_size=patch_size,
        hidden_dim=hidden_dim,
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
    )
    arch.update({k: v for k, v in overrides.items() if v is not None})
    if resnet_stages is not None:
        arch["resnet_stages"] = tuple(resnet_stages)
    stages = arch.pop("resnet_stages", None)
    missing = [k for k in overrides if k not in arch]
    if missing:
        raise ValueError(
            f"Without a variant, ViT needs {', '.join(missing)}; or pass a variant, "
            f"one of {', '.join(VARIANTS)}."
        )
    check_arguments(
        dict(arch, dropout_rate=dropout_rate, attention_dropout_rate=attention_dropout_rate,
             drop_path_rate=drop_path_rate)
    )
    vit_layers._check_choice("classifier", classifier, ("token", "gap"))
    vit_layers._check_choice("pos_embedding", pos_embedding, vit_layers.POSITION_EMBEDDINGS)
    height, width = _pair(image_size, "image_size")
    patch = arch["patch_size"]
    stride = patch if stages is None else patch * resnet.trunk_stride(stages)
    if height % stride or width % stride:
        raise ValueError(
            f"image_size {(height, width)} is not divisible by patch_size {stride}"
            + ("" if stages is None else " (ResNet trunk stride times feature-map patch size)")
            + f": use a multiple of {stride}."
        )

    images = keras.Input((height, width, channels), name="images")
    x = images if stages is None else resnet.resnet_trunk(images, stages)
    x = vit_layers.Patches(patch, name="patches")(x)
    x = vit_layers.PatchEncoder(
        arch["hidden_dim"],
        grid_size=(height // stride, width // stride),
        pos_embedding=pos_embedding,
        name="patch_encoder",
    )(x)
    if classifier == "token":
        x = vit_layers.ClassToken(
            use_position=pos_embedding.startswith("learned"), name="class_token"
        )(x)
    x = keras.layers.Dropout(dropout_rate, name="embedding_dropout")(x)
    depth = arch["num_layers"]
    for i in range(depth):
        x = vit_layers.TransformerBlock(
            arch["num_heads"],
            arch["mlp_dim"],
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=drop_path_rate * i / max(depth - 1, 1),
            gelu_approximate=gelu_approximate,
            name=f"encoderblock_{i}",
        )(x)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="encoder_norm")(x)
    if include_top or pooling:
        x = vit_layers.TokenPooling(classifier, name="pool")(x)
        if representation_size:
            x = keras.layers.Dense(representation_size, activation="tanh", name="pre_logits")(x)
    if include_top:
        x = keras.layers.Dense(
            num_classes,
            kernel_initializer="zeros",
            bias_initializer=keras.initializers.Constant(head_bias_init),
            dtype="float32",
            name="head",
        )(x)
    if name is None:
        name = "vit" if variant is None else f"vit-{variant.replace('/', '_')}"
    return VisionTransformer(images, x, name=name)


def preprocess(images):
    """Scales uint8 or [0, 255] images to the models' input range [-1, 1].

    Example:

    >>> float(preprocess(keras.ops.full((1, 2, 2, 3), 255))[0, 0, 0, 0])
    1.0
    """
    return (ops.cast(images, "float32") - 127.5) / 127.5
