"""Training at native resolution: the NaFlex `tf.data` pipelines
(`keras_vit.data.naflex_pipelines`) against `naflex_inputs` (PIL, HF's processor), their
buckets, packing and seeded determinism, and a NaFlex fine-tune through `keras_vit.train`
on digits drawn at mixed sizes and aspect ratios, scored on held-out digits.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import bad_sos, jpeg
from PIL import Image

import keras_vit
from keras_vit.data import naflex_pipelines
from keras_vit.data.naflex import (
    SIGLIP2_PREPROCESSING,
    NaFlexLayout,
    naflex_inputs,
    naflex_size,
    pack_rows,
)
from keras_vit.data.pipelines import eval_dataset, train_dataset
from keras_vit.data.sources import load_source
from keras_vit.digits import digits_arrays
from keras_vit.training import runs
from keras_vit.training.config import TrainConfig, apply_overrides

PATCH, BUDGET = 4, 16
# Canvas sizes (height, width) the digits are drawn on: tall, wide, square, odd.
CANVASES = [(16, 16), (16, 24), (24, 16), (16, 32), (32, 16), (20, 28)]


def _mixed_digits(split, count=None):
    """Digits of `split` upscaled to 16x16 and placed at a seeded spot of a canvas of
    one of several aspect ratios: uint8 `(h, w, 1)` images of mixed sizes, labels."""
    images, labels = digits_arrays(split)
    rng = np.random.default_rng(0 if split == "train" else 1)
    drawn = []
    for index, digit in enumerate(images[:count]):
        height, width = CANVASES[index % len(CANVASES)]
        canvas = np.zeros((height, width, 1), np.uint8)
        top, left = rng.integers(0, height - 15), rng.integers(0, width - 15)
        # As the fixed-size pipeline upscales them (bilinear), so that what a fixed-size
        # run learnt on the 16x16 digits carries over.
        upscaled = Image.fromarray(digit[..., 0]).resize((16, 16), Image.Resampling.BILINEAR)
        canvas[top:top + 16, left:left + 16] = np.asarray(upscaled)[..., None]
        drawn.append(canvas)
    return drawn, labels[:count]


def _write_folder(root, splits):
    """An image folder `root/{train,test}/{label}/{n}.png` of `_mixed_digits`."""
    for split, count in splits.items():
        for index, (image, label) in enumerate(zip(*_mixed_digits(split, count))):
            path = root / split / str(label) / f"{index:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0]).save(path)
    return root


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    return _write_folder(tmp_path_factory.mktemp("mixed"), {"train": None, "test": None})


def _images_of(source):
    """The source's images in its record order, read back with PIL (as `naflex_inputs`' users do)."""
    return [np.asarray(Image.open(key.decode()))[..., None]
            for key, _ in source.records.as_numpy_iterator()]


def _stream(source, batch_size, buckets=None, images_per_row=None, row_tokens=None, **kwargs):
    layout = NaFlexLayout(PATCH, BUDGET, buckets, images_per_row, row_tokens)
    return train_dataset(source, None, batch_size, channels=1, naflex=layout, **kwargs)


def _eval(source, batch_size):
    return eval_dataset(source, None, batch_size, channels=1, naflex=NaFlexLayout(PATCH, BUDGET),
                        preprocessing=SIGLIP2_PREPROCESSING)


def test_native_size_is_naflex_size():
    sizes = [(8, 8), (16, 36), (480, 640), (10, 1000), (1000, 10), (3, 5), (37, 41)]
    for height, width in sizes:
        for patch, budget in [(4, 16), (16, 256), (14, 49)]:
            got = naflex_pipelines.native_size(tf.constant(height), tf.constant(width), patch, budget)
            assert got.numpy().tolist() == list(naflex_size(height, width, patch, budget))


def test_eval_patches_equal_naflex_inputs(mixed_folder):
    """Every image's patches, grid and mask equal `naflex_inputs`' (PIL's resize) within
    one grey level (2 / 255 after scaling to [-1, 1]): TensorFlow resizes in float with
    the same antialiased triangle filter, PIL in 8-bit fixed point and rounds its result
    to whole grey levels; everything else (grid, order of the patches, padding) is exact."""
    source = load_source(str(mixed_folder), "test")
    images = _images_of(source)[:60]
    dataset = _eval(source, 20)
    done, grids = 0, set()
    for x, _ in dataset.take(3):
        expected = naflex_inputs(images[done:done + 20], PATCH, BUDGET)
        np.testing.assert_array_equal(x["spatial_shapes"], expected["spatial_shapes"])
        np.testing.assert_array_equal(x["patch_mask"], expected["patch_mask"])
        np.testing.assert_allclose(x["patches"], expected["patches"], atol=2 / 255 + 1e-6)
        done += 20
        grids.update(tuple(g) for g in expected["spatial_shapes"].tolist())
    assert grids == {(3, 5), (4, 4), (5, 3)}  # tall, square and wide


def test_padded_batches_take_the_smallest_bucket_holding_their_longest_image(mixed_folder):
    source = load_source(str(mixed_folder), "test")
    buckets = (8, 12, 15, BUDGET)
    seen = set()
    for x, labels in _stream(source, 2, buckets=buckets[:3], seed=1).take(40):
        longest = int(np.max(np.prod(x["spatial_shapes"], axis=-1)))
        tokens = x["patches"].shape[1]
        assert tokens == min(b for b in buckets if b >= longest)
        np.testing.assert_array_equal(
            x["patch_mask"], np.arange(tokens) < np.prod(x["spatial_shapes"], -1)[:, None])
        seen.add(tokens)
        assert labels.shape == (2, 10)
    assert len(seen) >= 2


def _unpacked(x, index, slot_labels, weights, row, slot):
    """One slot of a packed batch: its image's patches, grid and label, from the row."""
    mask = x["patch_mask"][row]
    return (x["patches"][row][mask == slot + 1], x["spatial_shapes"][row, slot],
            slot_labels[row, slot], weights[row, slot])


def test_packed_rows_hold_each_image_as_the_padded_pipeline_makes_it(mixed_folder):
    """Packed and padded streams of one seed read the same images; each slot of a
    packed row gives back its image's patches exactly, its grid, label and weight,
    filled first fit; the images left out fit in no row."""
    source = load_source(str(mixed_folder), "train")
    rows, row_tokens, slots = 3, 30, 3
    common = dict(seed=5, inception_crop=True, random_flip=True, randaugment=(2, 10))
    padded = _stream(source, 8, **common)
    packed = _stream(source, 8, images_per_row=slots, row_tokens=row_tokens, **common)
    left_out = 0
    for (x, labels), (px, plabels, weights) in zip(padded.take(4), packed.take(4)):
        assert px["patches"].shape == (rows, row_tokens, PATCH * PATCH)
        assert px["spatial_shapes"].shape == (rows, slots, 2) and weights.shape == (rows, slots)
        assert plabels.shape == (rows, slots, 10)
        px = {k: v.numpy() for k, v in px.items()}
        lengths = np.prod(x["spatial_shapes"], axis=-1)
        # Where each image goes, first fit in stream order.
        used, filled, placed = np.zeros(rows, int), np.zeros(rows, int), []
        for image, length in enumerate(lengths):
            fits = [r for r in range(rows) if filled[r] < slots and used[r] + length <= row_tokens]
            if not fits:
                left_out += 1
                continue
            row, slot = fits[0], filled[fits[0]]
            patches, grid, label, weight = _unpacked(px, None, plabels.numpy(), weights.numpy(), row, slot)
            np.testing.assert_array_equal(patches, x["patches"][image][:length])
            np.testing.assert_array_equal(grid, x["spatial_shapes"][image])
            np.testing.assert_array_equal(label, labels[image])
            assert weight == 1
            placed.append((row, slot))
            filled[row] += 1
            used[row] += length
        empty = [(r, s) for r in range(rows) for s in range(slots) if (r, s) not in placed]
        for row, slot in empty:
            assert weights[row, slot] == 0 and not plabels[row, slot].numpy().any()
            assert px["spatial_shapes"][row, slot].tolist() == [0, 0]
            assert not (px["patch_mask"][row] == slot + 1).any()
        assert (px["patches"][px["patch_mask"] == 0] == 0).all()
    assert left_out > 0


def test_pack_rows_of_naflex_inputs_unpack_to_them():
    images, _ = _mixed_digits("test", 7)
    inputs = naflex_inputs(images, PATCH, BUDGET)
    lengths = inputs["patch_mask"].sum(-1)
    packed, index = pack_rows(inputs["patches"], lengths, inputs["spatial_shapes"],
                              rows=7, row_tokens=2 * BUDGET, images_per_row=2)
    assert sorted(index[index >= 0].tolist()) == list(range(7))
    for row, slot in zip(*np.nonzero(index >= 0)):
        image = index[row, slot]
        got = packed["patches"][row][packed["patch_mask"][row] == slot + 1]
        np.testing.assert_array_equal(got, inputs["patches"][image][: lengths[image]])
        np.testing.assert_array_equal(packed["spatial_shapes"][row, slot], inputs["spatial_shapes"][image])


@pytest.mark.parametrize("packed", [False, True])
def test_a_stream_started_at_batch_n_is_the_stream_after_n_batches(mixed_folder, packed):
    source = load_source(str(mixed_folder), "train")
    layout = dict(images_per_row=2, row_tokens=24) if packed else dict(buckets=(10,))
    kwargs = dict(seed=7, randaugment=(2, 10), **layout)
    whole = list(_stream(source, 6, **kwargs).take(5))
    resumed = list(_stream(source, 6, start_batch=3, **kwargs).take(2))
    for expected, got in zip(whole[3:], resumed):
        for a, b in zip(tf.nest.flatten(expected), tf.nest.flatten(got)):
            np.testing.assert_array_equal(a, b)
    other = next(iter(_stream(source, 6, **{**kwargs, "seed": 8})))
    assert not np.array_equal(tf.nest.flatten(other)[0], tf.nest.flatten(whole[0])[0])


def test_crops_keep_each_image_near_its_own_aspect():
    """The crop draws its aspect ratio relative to the image's: a 1:4 image stays wide."""
    shape = tf.constant([40, 160, 1])
    for seed in range(20):
        _, size = naflex_pipelines.native_crop_window([seed, 0])(shape)
        rows, cols = size.numpy()[:2]
        assert 1 <= rows <= 40 and 1 <= cols <= 160
        assert 4 * 3 / 4 - 0.5 <= cols / rows <= 4 * 4 / 3 + 0.5


def test_mixing_refused_in_one_line():
    config = apply_overrides(TrainConfig(), ["data.naflex=true", "data.mixup=0.2"])
    with pytest.raises(ValueError, match=r"^data.mixup=0.2 mixes .*set data.mixup=none.$"):
        config.validate()
    config = apply_overrides(TrainConfig(), ["data.naflex=true", "data.augment=light2"])
    with pytest.raises(ValueError, match=r"^data.augment='light2' .*set data.mixup=0.$"):
        config.validate()
    with pytest.raises(ValueError, match="MixUp cannot mix them"):
        _stream(load_source("digits"), 4, mixup=0.2)
    config = apply_overrides(TrainConfig(), ["data.images_per_row=2"])
    with pytest.raises(ValueError, match=r"^data.images_per_row=2 needs data.naflex=true.$"):
        config.validate()
    config = apply_overrides(TrainConfig(), ["data.naflex=true", "data.naflex_buckets=(300,)"])
    with pytest.raises(ValueError, match="bucket 300 must be a token count in"):
        config.validate()


TINY_MODEL = dict(variant="custom", image_size=16, channels=1,
                  kwargs=dict(patch_size=PATCH, hidden_dim=32, num_layers=2, num_heads=4,
                              mlp_dim=64))
QUICK = dict(checkpointing=dict(tensorboard=False), distribution=dict(jit_compile="off"))


@pytest.mark.slow
def test_naflex_fine_tune_of_a_fixed_size_run_learns_digits_at_mixed_sizes(tmp_path, mixed_folder):
    """A fixed-size run on the 16x16 digits, then `keras_vit.train` fine-tunes it as a
    NaFlex model (`data.naflex=true`, the same variables) on digits drawn at six sizes
    and aspect ratios: the saved model, fed `naflex_inputs` of the 360 held-out digits
    (PIL's pixels, not the pipeline's), classifies them far above chance, as the run's
    own final evaluation says (within 3 points: the pipeline resizes with TensorFlow),
    better than after its first epoch."""
    fixed = TrainConfig(
        model=TINY_MODEL, data=dict(source="digits", batch_size=32, inception_crop=False,
                                    random_flip=False),
        schedule=dict(learning_rate=5e-3, decay="cosine", warmup_updates=10, epochs=5),
        evaluation=dict(enabled=False), out=str(tmp_path / "fixed"), **QUICK)
    keras_vit.train(fixed, verbose=0)
    config = apply_overrides(fixed, [
        f"data.source={mixed_folder}", "data.naflex=true", f"data.naflex_max_patches={2 * BUDGET}",
        "data.naflex_buckets=(24,)", "data.crop_area=(0.6, 1.0)", "evaluation.enabled=true",
        f"model.init_from={tmp_path / 'fixed'}", "schedule.epochs=4", "schedule.learning_rate=3e-3", f"out={tmp_path / 'naflex'}"])
    result = keras_vit.train(config, verbose=0)

    with open(tmp_path / "naflex" / runs.METRICS_JSON) as f:
        assert json.load(f)["final"]["top1"] == pytest.approx(result.metrics["top1"])
    model = keras.saving.load_model(tmp_path / "naflex" / runs.MODEL)
    assert model.get_layer("naflex_patches") is not None
    images, labels = _mixed_digits("test")
    inputs = naflex_inputs(images, PATCH, 2 * BUDGET, preprocessing=model.preprocessing)
    accuracy = np.mean(model.predict(inputs, verbose=0).argmax(-1) == labels)
    assert accuracy > 0.5, accuracy  # chance: 0.1
    assert result.metrics["top1"] == pytest.approx(accuracy, abs=0.03)
    # It learnt in the fine-tune, not only before it.
    assert result.history["val_top1"][-1] > result.history["val_top1"][0] + 0.03


def _tiny_pair():
    """A fixed-size tiny ViT on 16x16 grey images and the NaFlex one with its weights."""
    kwargs = dict(image_size=16, patch_size=PATCH, hidden_dim=16, num_layers=1, num_heads=2,
                  mlp_dim=32, channels=1, include_top=False,
                  preprocessing=SIGLIP2_PREPROCESSING)
    fixed = keras_vit.ViT(**kwargs)
    rng = np.random.default_rng(0)
    fixed.set_weights([rng.normal(0, 0.2, w.shape).astype("float32") for w in fixed.get_weights()])
    naflex = keras_vit.ViT(naflex=True, **kwargs)
    naflex.set_weights(fixed.get_weights())
    return fixed, naflex


def test_naflex_features_are_each_image_alone_at_its_aspect(mixed_folder):
    """`extract_features` of a NaFlex model, from `naflex_inputs` arrays (batches of 3,
    the last padded) and from the NaFlex eval pipeline, equal the model's output on each
    image alone; the labels pass through."""
    from keras_vit.evaluation.features import extract_features

    _, model = _tiny_pair()
    images, labels = _mixed_digits("test", 7)
    features, got = extract_features(model, naflex_inputs(images, PATCH, BUDGET), labels,
                                     batch_size=3)
    alone = np.concatenate([model.predict(naflex_inputs([image], PATCH, BUDGET), verbose=0)
                            for image in images])
    np.testing.assert_allclose(features, alone, atol=1e-5)
    assert got.tolist() == labels.tolist()
    source = load_source(str(mixed_folder), "test")
    dataset = _eval(source, 5).take(2)
    features, got = extract_features(model, dataset)
    first = naflex_inputs(_images_of(source)[:10], PATCH, BUDGET)
    np.testing.assert_allclose(features, model.predict(first, verbose=0), atol=0.05)
    assert len(got) == 10


def test_fewshot_of_a_naflex_model_equals_the_fixed_size_model_on_square_images():
    """On the square digits (upscaled 8 -> 16: the grid of the model's `image_size`, which
    the NaFlex resize picks within 16 tokens) a NaFlex model's few-shot evaluation is
    its fixed-size twin's."""
    from keras_vit.evaluation.fewshot import FewshotConfig, evaluate_source

    fixed, naflex = _tiny_pair()
    config = FewshotConfig(data="digits", classes="5-9", shots=(1, 5), seeds=2)
    expected = evaluate_source(fixed, config)
    # A packed model (as a packed run saves it) is evaluated one image per row, as its twin.
    packed = type(naflex).from_config({**naflex.get_config(), "images_per_row": 3})
    packed.set_weights(naflex.get_weights())
    for model in (naflex, packed):
        got = evaluate_source(model, config)
        assert got["class_names"] == expected["class_names"]
        for key in ("num_train", "num_test", "accuracy", "mean"):
            np.testing.assert_allclose(got[key], expected[key], err_msg=key)


@pytest.mark.parametrize("loss", ["softmax", "sigmoid"])
def test_the_loss_of_packed_rows_is_the_mean_over_their_images(loss):
    """Over `(rows, K, classes)` labels with `(rows, K)` weights the run's loss is the mean
    of each real image's loss (NumPy's), not diluted by the empty slots."""
    from keras_vit.training.engine import make_loss

    rng = np.random.default_rng(0)
    labels = np.eye(10, dtype="float32")[rng.integers(0, 10, (3, 4))]
    logits = rng.normal(size=(3, 4, 10)).astype("float32")
    weights = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], "float32")
    config = apply_overrides(TrainConfig(), ["data.naflex=true", "data.images_per_row=4",
                                             f"optimization.loss={loss}"])
    if loss == "softmax":
        log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        each = -(labels * log_p).sum(-1)
    else:
        each = (np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-abs(logits)))).sum(-1)
    expected = each[weights > 0].mean()
    got = float(make_loss(config)(labels, logits, sample_weight=weights))
    assert got == pytest.approx(expected, rel=1e-5)


def test_a_file_failing_to_decode_keeps_the_naflex_stream_in_place(tmp_path):
    """A JPEG that fails to decode (it passes the start-up check) is named once; in its
    training batch another image of the batch takes its place (the batches stay full
    and a resumed stream stays exact); the evaluation pass leaves it out."""
    root = _write_folder(tmp_path / "mixed", {"train": 40, "test": 40})
    bad = root / "train" / "3" / "bad.jpg"
    bad.write_bytes(bad_sos(jpeg(99, size=(40, 24))))
    source = load_source(str(root))
    assert source.size == 41 and not source.skipped
    whole = list(_stream(source, 6, seed=2, random_flip=False).take(8))
    assert list(source.undecodable) == [str(bad)]
    for x, _ in whole:  # full batches of real images: no stand-in patch of a 1x1 grid
        assert x["spatial_shapes"].shape == (6, 2) and (np.prod(x["spatial_shapes"], -1) > 1).all()
    resumed = list(_stream(source, 6, seed=2, random_flip=False, start_batch=5).take(3))
    for expected, got in zip(whole[5:], resumed):
        for a, b in zip(tf.nest.flatten(expected), tf.nest.flatten(got)):
            np.testing.assert_array_equal(a, b)
    passes = eval_dataset(source, None, 8, channels=1, naflex=NaFlexLayout(PATCH, BUDGET))
    assert sum(int(x["patches"].shape[0]) for x, _ in passes) == 40
