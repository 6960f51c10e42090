"""Masked patch prediction: corruption statistics, colour targets, loss masking, training."""

import keras
import numpy as np
import pytest
from scipy.special import log_softmax
from sklearn.datasets import load_digits

import keras_vit
from keras_vit import mpp
from keras_vit.fewshot import linear_fewshot_accuracy, sample_shots
from conftest import tiny_vit


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_corruption_proportions_over_many_seeded_draws():
    batch, num_patches, width = 1000, 64, 4
    mask_embedding = np.full((width,), 7.0, "float32")
    kinds_all, replaced_offsets = [], []
    for seed in range(4):
        embeddings = np.random.default_rng(seed).normal(size=(batch, num_patches, width))
        embeddings = embeddings.astype("float32")
        corrupted, kinds = mpp.corrupt_patch_embeddings(embeddings, mask_embedding, seed=seed)
        corrupted, kinds = _np(corrupted), _np(kinds)
        kinds_all.append(kinds)
        # Exactly half of every image's patches are corrupted.
        np.testing.assert_array_equal((kinds != mpp.CLEAN).sum(axis=1), num_patches // 2)
        # Clean and kept positions are untouched; masked ones hold the [mask] embedding.
        untouched = (kinds == mpp.CLEAN) | (kinds == mpp.KEPT)
        np.testing.assert_array_equal(corrupted[untouched], embeddings[untouched])
        masked = corrupted[kinds == mpp.MASKED]
        np.testing.assert_array_equal(masked, np.broadcast_to(mask_embedding, masked.shape))
        # Replaced positions hold another patch of the same image, never their own.
        for b, i in zip(*np.nonzero(kinds == mpp.REPLACED)):
            (source,) = np.nonzero((embeddings[b] == corrupted[b, i]).all(axis=1))[0]
            assert source != i
            replaced_offsets.append((source - i) % num_patches)
    kinds = np.concatenate(kinds_all)
    corrupt = kinds != mpp.CLEAN
    fractions = {
        k: np.sum(kinds == k) / corrupt.sum() for k in (mpp.MASKED, mpp.REPLACED, mpp.KEPT)
    }
    print("masked / replaced / kept:", fractions)
    # 128,000 corrupted positions: the binomial standard error is below 0.0012.
    assert abs(fractions[mpp.MASKED] - 0.8) < 0.01
    assert abs(fractions[mpp.REPLACED] - 0.1) < 0.01
    assert abs(fractions[mpp.KEPT] - 0.1) < 0.01
    # Every position is corrupted half the time (standard error 0.008 over 4000 images).
    assert np.abs(corrupt.mean(axis=0) - 0.5).max() < 0.05
    # The replacement is drawn uniformly among the other 63 patches (about 200 each).
    counts = np.bincount(replaced_offsets, minlength=num_patches)
    assert counts[0] == 0 and counts[1:].min() > 100 and counts[1:].max() < 320


def test_corruption_is_reproducible_from_its_seed_and_varies_between_calls():
    embeddings = np.random.default_rng(0).normal(size=(8, 16, 4)).astype("float32")
    mask = np.zeros((4,), "float32")
    first = _np(mpp.corrupt_patch_embeddings(embeddings, mask, seed=3)[1])
    again = _np(mpp.corrupt_patch_embeddings(embeddings, mask, seed=3)[1])
    np.testing.assert_array_equal(first, again)
    layer = mpp.PatchCorruption(seed=3)
    assert not np.array_equal(_np(layer(embeddings)[1]), _np(layer(embeddings)[1]))


def _numpy_mean_color_codes(images, patch_size, bits):
    """One patch at a time, the first channel most significant."""
    batch, height, width, channels = images.shape
    levels = 2**bits
    codes = []
    for image in images.astype("float64"):
        row = []
        for top in range(0, height, patch_size):
            for left in range(0, width, patch_size):
                patch = image[top : top + patch_size, left : left + patch_size]
                code = 0
                for c in range(channels):
                    level = min(int((patch[..., c].mean() + 1) / 2 * levels), levels - 1)
                    code = code * levels + level
                row.append(code)
        codes.append(row)
    return np.array(codes)


@pytest.mark.parametrize("channels, classes", [(3, 512), (1, 8)])
def test_mean_color_targets_equal_numpy(channels, classes):
    rng = np.random.default_rng(0)
    # Patches of one colour each, every class once: level k sits in the middle of bin k.
    codes = np.arange(classes)
    levels = np.stack([(codes // 8 ** (channels - 1 - c)) % 8 for c in range(channels)], -1)
    colours = -1 + (2 * levels + 1) / 8
    per_side = int(np.sqrt(classes // 2))  # two images of per_side x per_side patches
    grid = colours.reshape(2, per_side, per_side, channels)
    flat = np.repeat(np.repeat(grid, 2, axis=1), 2, axis=2).astype("float32")  # 2x2 patches
    targets = _np(mpp.mean_color_targets(flat, 2))
    np.testing.assert_array_equal(targets.reshape(-1), codes)
    # Random images: per-pixel colours vary inside a patch, including the -1 and 1 ends.
    images = rng.uniform(-1, 1, size=(3, 32, 32, channels)).astype("float32")
    images[0, :8, :8] = 1.0
    images[1, :8, :8] = -1.0
    images[2] = np.round(images[2])  # patches of -1, 0 and 1 pixels
    targets = _np(mpp.mean_color_targets(images, 8))
    expected = _numpy_mean_color_codes(images, 8, 3)
    np.testing.assert_array_equal(targets, expected)
    assert targets[0, 0] == classes - 1 and targets[1, 0] == 0
    assert len(np.unique(expected)) > 3


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="bits must be a positive integer, got 0"):
        mpp.mean_color_targets(np.zeros((1, 8, 8, 3), "float32"), 4, bits=0)
    with pytest.raises(ValueError, match=r"got shape \(8, 8, 3\)"):
        mpp.mean_color_targets(np.zeros((8, 8, 3), "float32"), 4)
    embeddings = np.zeros((2, 16, 4), "float32")
    with pytest.raises(ValueError, match="mask_rate must be in"):
        mpp.corrupt_patch_embeddings(embeddings, np.zeros(4, "float32"), 0, mask_rate=1.5)
    with pytest.raises(ValueError, match=r"at most 1, got 0.8 \+ 0.3"):
        mpp.corrupt_patch_embeddings(embeddings, np.zeros(4, "float32"), 0, random_rate=0.3)
    with pytest.raises(ValueError, match=r"at least 2 patches, got embeddings of shape \(2, 1"):
        mpp.corrupt_patch_embeddings(embeddings[:, :1], np.zeros(4, "float32"), 0)
    model = mpp.MaskedPatchPrediction(tiny_vit())
    with pytest.raises(ValueError, match="without loss= .got loss='mse'"):
        model.compile(optimizer="adam", loss="mse")
    features = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)], name="mlp")
    with pytest.raises(ValueError, match="keras_vit.ViT encoder with a 'patches' layer; 'mlp'"):
        mpp.MaskedPatchPrediction(features)
    with pytest.raises(ValueError, match=r"computes them with \['conv_root', 'gn_root'"):
        mpp.MaskedPatchPrediction(tiny_vit(patch_size=1, resnet_stages=()))


def test_uncorrupted_forward_equals_the_encoder():
    encoder = tiny_vit()
    model = mpp.MaskedPatchPrediction(encoder, corrupt_rate=0.0)
    model.get_layer("mpp_head").kernel.assign(np.random.default_rng(0).normal(size=(32, 512)))
    tokens = keras.Model(encoder.input, encoder.get_layer("encoder_norm").output)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    out = model(images)
    expected = model.get_layer("mpp_head")(tokens(images)[:, 1:])  # after the class token
    np.testing.assert_allclose(_np(out["logits"]), _np(expected), rtol=1e-5, atol=1e-5)
    assert _np(out["corrupted"]).sum() == 0


def test_loss_and_gradients_come_from_corrupted_positions_only():
    import tensorflow as tf

    model = mpp.MaskedPatchPrediction(tiny_vit(), seed=0)
    model.get_layer("mpp_head").kernel.assign(
        np.random.default_rng(0).normal(scale=0.1, size=(32, 512))
    )
    images = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    weights = model.trainable_weights
    with tf.GradientTape(persistent=True) as tape:
        out = model(images, training=True)
        tape.watch(out["logits"])
        targets, corrupted = _np(out["targets"]), _np(out["corrupted"])
        other_clean = np.where(corrupted == 0, (targets + 1 + np.arange(16)) % 512, targets)
        other_corrupt = np.where(corrupted == 1, (targets + 1) % 512, targets)
        loss = mpp.masked_patch_loss(targets, out["logits"], out["corrupted"])
        loss_clean = mpp.masked_patch_loss(other_clean, out["logits"], out["corrupted"])
        loss_corrupt = mpp.masked_patch_loss(other_corrupt, out["logits"], out["corrupted"])
    # Softmax cross-entropy averaged over the corrupted positions, computed by scipy.
    log_p = log_softmax(_np(out["logits"]).astype("float64"), axis=-1)
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(float(loss), -picked[corrupted == 1].mean(), rtol=1e-5)
    assert float(model.compute_loss(y_pred=out)) == float(loss)

    assert float(loss_clean) == float(loss)
    assert float(loss_corrupt) != float(loss)
    grads = tape.gradient(loss, weights)
    for grad, grad_clean in zip(grads, tape.gradient(loss_clean, weights)):
        np.testing.assert_array_equal(_np(grad), _np(grad_clean))
    assert any(not np.array_equal(_np(a), _np(b))
               for a, b in zip(grads, tape.gradient(loss_corrupt, weights)))
    logit_grads = _np(tape.gradient(loss, out["logits"]))
    assert np.all(logit_grads[corrupted == 0] == 0)
    assert np.all(np.abs(logit_grads[corrupted == 1]).sum(-1) > 0)


def test_mpp_pretraining_on_digits_improves_10_shot_accuracy(tmp_path):
    import tensorflow as tf

    digits = load_digits()
    images = (digits.images[..., None] / 8.0 - 1.0).astype("float32")  # [0, 16] -> [-1, 1]
    labels = digits.target
    pretrain, held_x, held_y = images[:1000], images[1000:], labels[1000:]
    # One-pixel patches: the targets are the 8-level grey values of masked pixels.
    encoder = keras_vit.ViT(
        image_size=8, patch_size=1, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64,
        channels=1, classifier="gap", include_top=False,
    )

    def ten_shot_accuracy():
        features = _np(encoder(held_x))
        accuracies = []
        for seed in range(10):
            shots = sample_shots(held_y, 10, seed=seed)
            rest = np.setdiff1d(np.arange(len(held_y)), shots)
            accuracies.append(linear_fewshot_accuracy(
                features[shots], held_y[shots], features[rest], held_y[rest]
            ))
        return float(np.mean(accuracies))

    random_init = ten_shot_accuracy()
    model = mpp.MaskedPatchPrediction(encoder, seed=0)
    steps = 5 * 1000 // 64
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, steps, warmup_target=1e-2, warmup_steps=steps // 10
    )
    model.compile(optimizer=keras.optimizers.Adam(schedule))
    # A labelled source as the engine gives it: fit ignores the labels.
    source = tf.data.Dataset.from_tensor_slices((pretrain, labels[:1000])).batch(64)
    history = model.fit(source, epochs=5, verbose=0)
    assert sorted(history.history) == ["accuracy", "loss"]
    pretrained = ten_shot_accuracy()
    print(f"10-shot accuracy on held-out digits: random init {random_init:.3f}, "
          f"after MPP pretraining {pretrained:.3f}")
    assert pretrained > random_init + 0.05
    # The encoder trained in place is a plain ViT that saves and loads as one.
    encoder.save(tmp_path / "encoder.keras")
    restored = keras.saving.load_model(tmp_path / "encoder.keras")
    np.testing.assert_array_equal(_np(restored(held_x)), _np(encoder(held_x)))
