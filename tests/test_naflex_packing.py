"""Packed NaFlex rows (`ViT(naflex=True, images_per_row=K)`, NaViT's packing): several
images of several grids in one row, against the unpacked NaFlex model (the same weights)
run on each image alone.

The module runs on the current backend; tests/test_backends_*.py runs it on the others.
"""

import keras
import numpy as np
import pytest

import keras_vit
from family_contract import as_numpy, predicted
from helpers import assert_keras_file_round_trip, randomise_weights
from keras_vit.families import dinov3
from keras_vit.layers.naflex import SlotMasks

PATCH, SLOTS = 8, 3
TINY = dict(image_size=4 * PATCH, patch_size=PATCH, hidden_dim=16, num_layers=2,
            num_heads=2, mlp_dim=32, naflex=True, pos_interpolation="bilinear_antialias")
# Each row's images (slot 1, 2, ...): grids up- and down-sampling the 4x4 table, a single
# patch, and an empty slot; 24 tokens leave padding after each row's last image.
ROWS = [[(3, 5), (2, 2), (1, 1)], [(2, 7), (1, 3)]]
TOKENS = 24
ATOL = 2e-5


def _images(seed=0):
    """Random `(h * P, w * P, 3)` pixels in [-1, 1], row by row."""
    rng = np.random.default_rng(seed)
    return [[rng.uniform(-1, 1, (h * PATCH, w * PATCH, 3)).astype("float32") for h, w in row]
            for row in ROWS]


def _cut(image):
    """An image's `(h * w, P * P * 3)` patches, row-major, (row, col, channel) inside."""
    h, w = image.shape[0] // PATCH, image.shape[1] // PATCH
    return image.reshape(h, PATCH, w, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(h * w, -1)


def _packed(images, tokens=TOKENS):
    """The packed batch of `images` (a list of rows) as the contract lays it out."""
    patches = np.zeros((len(images), tokens, PATCH * PATCH * 3), "float32")
    mask = np.zeros((len(images), tokens), "int32")
    shapes = np.zeros((len(images), SLOTS, 2), "int32")
    for r, row in enumerate(images):
        start = 0
        for k, image in enumerate(row):
            cut = _cut(image)
            patches[r, start : start + len(cut)] = cut
            mask[r, start : start + len(cut)] = k + 1
            shapes[r, k] = (image.shape[0] // PATCH, image.shape[1] // PATCH)
            start += len(cut)
    return {"patches": patches, "patch_mask": mask, "spatial_shapes": shapes}


def _alone(image):
    """One image as an unpacked NaFlex batch of one, unpadded."""
    cut = _cut(image)
    return {"patches": cut[None], "patch_mask": np.ones((1, len(cut)), "int32"),
            "spatial_shapes": np.asarray([image.shape[:2]], "int32") // PATCH}


def _models(overrides, seed=2):
    """A packed model and the unpacked NaFlex model with the same (random) weights."""
    arguments = {**TINY, **overrides}
    unpacked = keras_vit.ViT(**arguments)
    randomise_weights(unpacked, seed=seed)
    packed = keras_vit.ViT(**arguments, images_per_row=SLOTS)
    packed.set_weights(unpacked.get_weights())
    return packed, unpacked


FAMILIES = {
    "class_token": dict(classifier="token", num_classes=5),
    "map_siglip": dict(classifier="map", include_top=False),
    "mean": dict(classifier="gap", num_classes=5, pos_embedding="sincos2d"),
    "registers_dinov2": dict(classifier="token", num_registers=2, layer_scale_init=1e-5,
                             include_top=False),
    "avg_rope_eva02": dict(classifier="avg", fc_norm=True, mlp="swiglu", rope=True,
                           rope_reference_grid=(4, 4), num_classes=5),
    "rope_dinov3": dict(classifier="token", rope=dinov3.rope(), pos_embedding="none",
                        num_registers=4, include_top=False),
}


def _assert_each_slot_is_its_image_alone(outputs, unpacked, images):
    for r, row in enumerate(images):
        for k, image in enumerate(row):
            expected = predicted(unpacked, _alone(image))[0]
            np.testing.assert_allclose(outputs[r, k], expected, rtol=0, atol=ATOL,
                                       err_msg=f"row {r}, slot {k + 1}")
    assert np.isfinite(outputs).all()  # the empty slot too


@pytest.mark.parametrize("family", FAMILIES)
def test_each_slot_equals_the_unpacked_model_on_its_image_alone(family):
    packed, unpacked = _models(FAMILIES[family])
    images = _images()
    outputs = predicted(packed, _packed(images))
    width = FAMILIES[family].get("num_classes", 16) if packed.architecture.include_top else 16
    assert outputs.shape == (len(ROWS), SLOTS, width)
    _assert_each_slot_is_its_image_alone(outputs, unpacked, images)


def test_without_the_slot_mask_the_images_see_each_other(monkeypatch):
    """Negative control: the plain padding mask (every real token attends to every real
    token of the row) in place of the slots' gives other outputs."""
    packed, unpacked = _models(FAMILIES["class_token"])
    images = _images()
    inputs = _packed(images)
    expected = predicted(unpacked, _alone(images[0][0]))[0]
    np.testing.assert_allclose(predicted(packed, inputs)[0, 0], expected, rtol=0, atol=ATOL)
    slot_masks = SlotMasks.call

    def padding_mask_only(self, slots):
        pairs, rows = slot_masks(self, slots)
        keys = keras.ops.cast(keras.ops.greater(slots, 0), "float32")[:, None, :]
        return keras.ops.ones_like(pairs) * keys, rows

    monkeypatch.setattr(SlotMasks, "call", padding_mask_only)
    leaky, _ = _models(FAMILIES["class_token"])  # the same weights, run with the plain mask
    leaked = predicted(leaky, inputs)[0, 0]
    assert np.abs(leaked - expected).max() > 50 * ATOL


@pytest.mark.parametrize("family", ["class_token", "registers_dinov2", "map_siglip"])
def test_the_variables_are_the_unpacked_and_fixed_size_models(family):
    arguments = {**TINY, **FAMILIES[family]}
    packed = keras_vit.ViT(**arguments, images_per_row=SLOTS)
    unpacked = keras_vit.ViT(**arguments)
    fixed = keras_vit.ViT(**dict(arguments, naflex=False))

    def variables(model):
        return [(w.path, tuple(w.shape)) for w in model.weights]

    assert variables(packed) == variables(unpacked) == variables(fixed)


def _unpacked_batch(images, tokens=TOKENS):
    """All the images of `images` (rows) as one unpacked NaFlex batch, padded."""
    alone = [_alone(image) for row in images for image in row]
    patches = np.zeros((len(alone), tokens, PATCH * PATCH * 3), "float32")
    mask = np.zeros((len(alone), tokens), "int32")
    for i, one in enumerate(alone):
        count = one["patches"].shape[1]
        patches[i, :count], mask[i, :count] = one["patches"][0], 1
    shapes = np.concatenate([one["spatial_shapes"] for one in alone])
    return {"patches": patches, "patch_mask": mask, "spatial_shapes": shapes}


def test_a_training_step_on_packed_rows_is_one_on_the_images_unpacked():
    """The contract's training batch (per-slot labels, sample weights 0 for the empty
    slot) takes the SGD step that the same images take unpacked: the same summed loss,
    so the same gradients, through the slot masks, the pooling and the per-slot prefix."""
    packed, unpacked = _models(FAMILIES["registers_dinov2"] | dict(include_top=True,
                                                                  num_classes=5))
    images = _images()
    rng = np.random.default_rng(3)
    labels = np.eye(5, dtype="float32")[rng.integers(0, 5, (len(ROWS), SLOTS))]
    weights = np.asarray([[1.0] * len(row) + [0.0] * (SLOTS - len(row)) for row in ROWS],
                         "float32")
    for model in (packed, unpacked):
        model.compile(optimizer=keras.optimizers.SGD(1.0),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True,
                                                                reduction="sum"))
    packed.train_on_batch(_packed(images), labels, sample_weight=weights)
    unpacked.train_on_batch(_unpacked_batch(images), labels[weights == 1])
    for after, expected in zip(packed.weights, unpacked.weights):
        np.testing.assert_allclose(as_numpy(after), as_numpy(expected), rtol=0, atol=1e-5,
                                   err_msg=after.path)


def test_keras_file_round_trip(tmp_path):
    packed, _ = _models(FAMILIES["registers_dinov2"])
    assert packed.get_config()["images_per_row"] == SLOTS
    assert "images_per_row" not in keras_vit.ViT(**TINY).get_config()
    assert_keras_file_round_trip(packed, _packed(_images()), tmp_path / "packed.keras")


def test_jit_compiled_outputs_are_the_same_at_two_token_counts():
    # One block: on PyTorch this is torch.compile, whose graphs grow with the depth.
    packed, unpacked = _models(dict(FAMILIES["class_token"], num_layers=1))
    packed.compile(jit_compile=True)
    images = _images()
    short = packed.predict_on_batch(_packed(images, tokens=TOKENS))
    long = packed.predict_on_batch(_packed(images, tokens=TOKENS + 8))
    np.testing.assert_allclose(short, long, rtol=0, atol=ATOL)
    _assert_each_slot_is_its_image_alone(as_numpy(short), unpacked, images)


@pytest.mark.parametrize("arguments, message", [
    (dict(images_per_row=2, naflex=False),
     r"images_per_row=2 packs NaFlex images into a row, which needs naflex=True"),
    (dict(images_per_row=0), r"images_per_row must be a positive integer, got 0\."),
    (dict(images_per_row=True), r"images_per_row must be a positive integer, got True\."),
])
def test_bad_images_per_row_is_refused_naming_it(arguments, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**{**TINY, **arguments})


def test_spatial_shapes_of_another_slot_count_are_refused_naming_the_shape():
    packed, _ = _models(FAMILIES["class_token"])
    inputs = _packed(_images())
    inputs["spatial_shapes"] = inputs["spatial_shapes"][:, :2]
    # The model's input (Keras' check), and the layer alone.
    with pytest.raises(ValueError, match=r"'spatial_shapes'.* expected shape=\(None, 3, 2\), "
                                         r"found shape=\(2, 2, 2\)"):
        packed(inputs)
    with pytest.raises(ValueError, match=r"images_per_row=3 images takes spatial_shapes of "
                                         r"shape \(batch, 3, 2\), got \(2, 2, 2\)"):
        packed.parts.patches(inputs["patches"], inputs["spatial_shapes"], inputs["patch_mask"])
