"""A model's NaFlex mode, for serving it: whether a model takes NaFlex inputs
(`keras_vit.ViT(naflex=True)`), the token budget and the preprocessing that
`keras_vit.naflex_inputs` makes its inputs with, and `naflex_twin`, the NaFlex model of
a fixed-grid model's architecture holding its weights.
"""

from keras_vit.layers.naflex import NaFlexPatches
from keras_vit.models.preprocessing import model_preprocessing
from keras_vit.models.vit import VisionTransformer, vit_parts

# What a NaFlex twin changes: the input, and what only training or fixed grids use.
# A packed model (`images_per_row`) is trained on rows of several images; it serves one per row.
TWIN_SWITCHES = dict(naflex=True, images_per_row=None, dynamic_image_size=False,
                     dynamic_image_pad=False, remat=False)


def is_naflex(model):
    """Whether `model` is a `keras_vit.ViT` that takes NaFlex inputs.

    Example:

    >>> import keras_vit
    >>> is_naflex(keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                         num_heads=4, mlp_dim=64, naflex=True))
    True
    """
    try:
        return isinstance(vit_parts(model).patches, NaFlexPatches)
    except ValueError:  # not a keras-vit ViT
        return False


def naflex_budget(model):
    """The token budget of a NaFlex model (`max_num_patches` of `naflex_inputs`): the
    patches of the grid its position table holds (SigLIP 2's 16 x 16: 256, the
    processor's default).

    Example:

    >>> import keras_vit
    >>> naflex_budget(keras_vit.ViT(image_size=(32, 48), patch_size=8, hidden_dim=32,
    ...                             num_layers=1, num_heads=4, mlp_dim=64, naflex=True))
    24
    """
    rows, cols = vit_parts(model).grid_size
    return rows * cols


def naflex_preprocessing(model):
    """The preprocessing `naflex_inputs` applies for `model`: its weights' mean and
    std, and the NaFlex resize (PIL's antialiased bilinear, `Siglip2ImageProcessor`'s),
    whatever resize its fixed-size evaluation used; no crop.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64,
    ...                       preprocessing=dict(interpolation="bicubic", crop_fraction=0.9))
    >>> sorted(naflex_preprocessing(model).items())  # doctest: +NORMALIZE_WHITESPACE
    [('antialias', True), ('crop_fraction', None), ('interpolation', 'bilinear'),
     ('mean', [0.5, 0.5, 0.5]), ('std', [0.5, 0.5, 0.5])]
    """
    return dict(model_preprocessing(model), interpolation="bilinear", antialias=True,
                crop_fraction=None)


def naflex_twin(model):
    """`model` as a NaFlex model: the same architecture built with `naflex=True` (its
    patches cut by `naflex_inputs`, its position table resampled to each image's grid
    with the model's `pos_interpolation`), holding the same weights; a NaFlex model of
    one image per row is returned as it is, a packed one (`images_per_row`) as its
    one-image-per-row twin.

    Raises a `ValueError` naming what the architecture has that NaFlex cannot (a
    hybrid's ResNet stem, DeiT's distillation head), and, should the twin's variables
    differ from the model's, the first that does.

    Example:

    >>> import keras, numpy as np, keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> twin = naflex_twin(model)
    >>> inputs = keras_vit.naflex_inputs([np.zeros((32, 32, 3), np.uint8)], 8, 16)
    >>> image = np.full((1, 32, 32, 3), -1.0, np.float32)
    >>> same = np.allclose(twin.predict(inputs, verbose=0), model.predict(image, verbose=0),
    ...                    atol=1e-5)
    >>> bool(same)
    True
    """
    if is_naflex(model) and not model.architecture.images_per_row:
        return model
    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"A NaFlex twin is built from a keras_vit.ViT, got {type(model).__name__} "
            f"{getattr(model, 'name', '')!r}: pass the ViT itself."
        )
    config = model.get_config()
    for name, refused, why in (
        ("resnet_stages", config.get("resnet_stages") is not None,
         "a hybrid's ResNet stem convolves the whole image, which NaFlex takes as patches"),
        ("distilled", config.get("distilled") and config.get("distillation_head", True),
         "DeiT's distillation head pools a second token, which NaFlex does not"),
    ):
        if refused:
            raise ValueError(
                f"Model {model.name!r} has no NaFlex twin: {name}={config[name]!r} ({why}); "
                "run it at its own size, without NaFlex."
            )
    twin = type(model).from_config({**config, **TWIN_SWITCHES})
    ours = [(v.path, tuple(v.shape)) for v in model.weights]
    theirs = [(v.path, tuple(v.shape)) for v in twin.weights]
    if ours != theirs:
        first = next((a, b) for a, b in zip(ours + [None], theirs + [None]) if a != b)
        raise ValueError(
            f"The NaFlex twin of model {model.name!r} holds other variables than it: "
            f"{first[0]} in the model, {first[1]} in the twin; please report it with the "
            "model config."
        )
    twin.set_weights(model.get_weights())
    return twin
