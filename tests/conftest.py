import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


def tiny_vit(**overrides):
    """The 2-layer, width-32 ViT on 32x32 images the tests share."""
    import keras_vit

    kwargs = dict(
        image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4,
        mlp_dim=64, num_classes=10,
    )
    kwargs.update(overrides)
    return keras_vit.ViT(**kwargs)
