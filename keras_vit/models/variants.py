"""The paper's ViT variants (`"B/16"`, `"R50+L/32"`) and their architecture, without Keras.

`keras_vit.ViT` builds them; the registry of checkpoints and the command line read them
before Keras starts (`keras-vit weights` answers without importing it).
"""

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
