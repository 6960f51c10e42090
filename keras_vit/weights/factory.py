"""`ViT(variant, weights=...)`: the model of its architecture arguments, started from
pretrained weights when given.

It sits above `keras_vit.models` (which builds models and knows no checkpoint) and
`keras_vit.weights.pretrained` (which finds and reads them); `keras_vit.ViT` is this.
"""

from keras_vit.models.vit import VisionTransformer
from keras_vit.weights import pretrained, sources


def ViT(variant=None, *, weights=None, **kwargs):
    """Builds a Vision Transformer (a `VisionTransformer`), with pretrained `weights`.

    Args:
        variant: a paper variant such as `"B/16"` or a hybrid such as `"R50+B/16"`;
            see `VisionTransformer` for it and for every other argument (`image_size`,
            `num_classes`, `patch_size`, ..., `include_top`).
        weights: pretrained weights to start from, as `keras_vit.load_pretrained` loads
            them (the position embedding resampled to `image_size`, a head of another
            class count reset to zeros, `pre_logits` dropped without
            `representation_size`): a registry name (`keras_vit.list_weights()`),
            `hf:ORG/NAME`, `timm:NAME`, a URL or a local checkpoint. A registry name
            or an HF model directory (`hf:ORG/NAME`) also gives the variant (or
            sizes), resolution, classes, GELU and family switches (DeiT's
            `distilled`, ...) that are not passed.
        **kwargs: the `VisionTransformer` arguments.

    Returns:
        The `VisionTransformer`.

    Example:

    >>> import keras
    >>> model = ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...             num_heads=4, mlp_dim=64, num_classes=10)
    >>> tuple(model(keras.ops.zeros((1, 32, 32, 3))).shape)
    (1, 10)

    Fine-tuning an ImageNet-21k checkpoint at 384 px on 10 classes (downloads it once):

    >>> model = ViT("B/16", weights="vit_base_patch16_224.augreg_in21k",
    ...             image_size=384, num_classes=10)  # doctest: +SKIP
    """
    if weights is None:
        return VisionTransformer(variant, **kwargs)
    source = sources.resolve_source(weights)
    arguments = pretrained.source_defaults(source, dict(variant=variant, **kwargs))
    if arguments.get("preprocessing") is None:  # the weights expect their pixels
        arguments["preprocessing"] = source.preprocessing
    model = VisionTransformer(**arguments)
    pretrained.load_pretrained(model, source)
    return model
