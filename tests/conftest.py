import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402

# Scripts the distributed tests start in worker processes; importing one runs it.
collect_ignore = ["jax_distribution_job.py", "multiworker_job.py"]

# Docstring examples (keras_vit/, collected by --doctest-modules) that train a model for
# some epochs: they run in the full suite, not in the quick subset (-m "not slow").
SLOW_EXAMPLES = {"keras_vit.training.engine.train"}


def pytest_collection_modifyitems(config, items):
    # A conftest's collection hook sees every collected item, those of keras_vit/ too.
    for item in items:
        if item.name in SLOW_EXAMPLES:
            item.add_marker(pytest.mark.slow)


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


def randomise_weights(model, seed, scale=0.2):
    """Non-default weights, so that a lost or misplaced tensor shows in the outputs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(scale=scale, size=v.shape).astype("float32"))
    return rng


def assert_keras_file_round_trip(model, inputs, path):
    """Saving to and loading from a `.keras` file gives identical outputs."""
    import numpy as np

    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(inputs)), keras.ops.convert_to_numpy(model(inputs))
    )


def decodes(payload):
    """Whether TensorFlow's decoder reads the file bytes `payload` (the reference the
    start-up check of image folders is held to)."""
    import tensorflow as tf

    try:
        tf.io.decode_image(payload, expand_animations=False)
        return True
    except tf.errors.InvalidArgumentError:
        return False
