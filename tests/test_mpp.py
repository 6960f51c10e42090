"""Masked patch prediction: corruption statistics, colour targets, loss masking, training."""

import json

import keras
import numpy as np
import pytest
from scipy.special import log_softmax

from keras_vit import cli
from keras_vit.models import mpp
from keras_vit.training import runs
from keras_vit.training.config import TrainConfig
from helpers import tiny_vit


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


def test_an_encoder_with_imagenet_preprocessing_predicts_the_same_colours():
    # An encoder normalised with ImageNet's mean and std (DeiT's) sees other numbers for
    # the same pixels; its targets are still the colours of the pixels, read in [-1, 1].
    from keras_vit.models.preprocessing import IMAGENET_MEAN, IMAGENET_STD, normalize

    imagenet = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
    pixels = np.random.default_rng(4).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    pixels[:, :16] = pixels[:, :16] * 0.1  # some dark patches, whose codes differ most
    expected = _numpy_mean_color_codes(pixels / 127.5 - 1, 8, bits=3)
    encoder = tiny_vit(include_top=False, preprocessing=imagenet)
    model = mpp.MaskedPatchPrediction(encoder, seed=0)
    targets = _np(model(normalize(pixels, imagenet))["targets"])
    np.testing.assert_array_equal(targets, expected)
    assert len(np.unique(expected)) > 8


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
    with pytest.raises(ValueError, match=r"needs a keras_vit.ViT encoder. Model 'mlp' \(Sequential\) is not"):
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


def _ten_shot_accuracy(model, config):
    """Mean 10-shot linear accuracy on the digits test split, shots drawn from train."""
    from keras_vit import data
    from keras_vit.evaluation.fewshot import evaluate_model

    splits = [
        data.eval_dataset(data.load_source("digits", split), config.model.image_size, 512,
                          channels=config.model.channels, crop_fraction=1.0)
        for split in ("train", "test")
    ]
    return evaluate_model(model, *splits, shots=(10,), seeds=5)["mean"][0]


@pytest.mark.slow  # pretrains, then fine-tunes
def test_mpp_recipe_pretrains_an_encoder_that_fewshot_and_finetune_take(tmp_path, capsys):
    from keras_vit.training.engine import _build_model

    out, tuned = tmp_path / "mpp", tmp_path / "tuned"
    assert cli.main(["pretrain", "--recipe", "demo_mpp", "--out", str(out),
                     "--set", "checkpointing.tensorboard=false"]) == 0
    config = cli.load_recipe("demo_mpp")
    metrics = json.loads((out / runs.METRICS_JSON).read_text())
    assert sorted(metrics["final"]) == ["accuracy", "loss"]  # on the corrupted test pixels
    # The run's model is the encoder alone, a plain ViT without a head.
    encoder = runs.load_model(str(out))
    assert encoder.output_shape == (None, 32)
    assert "head" not in [layer.name for layer in encoder.layers]
    keras.utils.set_random_seed(config.seed)
    random_init = _build_model(config, num_classes=10)
    before, after = _ten_shot_accuracy(random_init, config), _ten_shot_accuracy(encoder, config)
    with capsys.disabled():
        print(f"\n10-shot accuracy on the digits test split: random init {before:.3f}, "
              f"after MPP pretraining ({metrics['seconds']:.0f} s) {after:.3f}")
    assert after > before + 0.05

    # Fine-tuning starts from the encoder: the head (absent) is reset, the rest copied.
    # Two Adam steps, the first at learning rate 0 (warmup), the second at 1e-3, move
    # a weight by a few 1e-3 at most (|Adam step| <= lr (1 - beta_1) / sqrt(1 - beta_2)).
    capsys.readouterr()
    assert cli.main(["finetune", "--recipe", "demo_mpp", "--from", str(out), "--out", str(tuned),
                     "--set", "optimization.objective=supervised",
                     "--set", "schedule.micro_batches_per_epoch=2",
                     "--set", "schedule.learning_rate=1e-3", "--set", "schedule.warmup_updates=1",
                     "--set", "schedule.epochs=1", "--set", "evaluation.enabled=false",
                     "--set", "distribution.jit_compile=off",
                     "--set", "checkpointing.tensorboard=false"]) == 0
    assert f"loaded {out}: the checkpoint has no head: the head is reset to zeros." in (
        capsys.readouterr().err
    )
    finetuned = runs.load_model(str(tuned))
    assert finetuned.output_shape == (None, 10)
    for name in ("patch_encoder", "encoderblock_0", "encoderblock_1", "encoder_norm"):
        for mine, theirs in zip(finetuned.get_layer(name).get_weights(),
                                encoder.get_layer(name).get_weights()):
            np.testing.assert_allclose(mine, theirs, atol=5e-3)
    # ... while pretraining moved them far from their initial values.
    pairs = zip(encoder.get_weights(), random_init.get_weights())
    assert max(np.abs(a - b).max() for a, b in pairs) > 0.1


def test_mpp_recipe_holds_the_papers_settings():
    path = cli.find_recipe("mpp", "pretrain")
    assert path.name == "pretrain_mpp.py"
    config = cli.load_recipe("mpp", "pretrain").validate()
    # Paper appendix B.1.2: ViT-B/16, batch 4096, Adam at 2e-4, 10k warmup, cosine, 1M steps.
    optimization, schedule = config.optimization, config.schedule
    assert (optimization.objective, config.model.variant, config.data.batch_size) == (
        "mpp", "B/16", 4096,
    )
    assert (optimization.optimizer, schedule.learning_rate, schedule.decay) == (
        "adam", 2e-4, "cosine",
    )
    assert (schedule.warmup_updates, schedule.updates) == (10_000, 1_000_000)
    assert (optimization.mpp_bits, optimization.mpp_corrupt_rate, optimization.mpp_mask_rate,
            optimization.mpp_random_rate) == (3, 0.5, 0.8, 0.1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(objective="mim"), "Unknown optimization.objective 'mim': expected one of 'supervised', 'mpp'"),
        (dict(mpp_corrupt_rate=1.5), r"optimization.mpp_corrupt_rate must be in \[0, 1\], got 1.5"),
        (dict(mpp_random_rate=0.3),
         r"optimization.mpp_mask_rate \+ optimization.mpp_random_rate must be at most 1"),
        (dict(mpp_bits=0), "optimization.mpp_bits must be a positive integer, got 0"),
        (dict(loss="sigmoid"), "optimization.loss='sigmoid' does not apply to objective='mpp'"),
        (dict(label_smoothing=0.1),
         "optimization.label_smoothing=0.1 does not apply to objective='mpp'"),
    ],
)
def test_mpp_settings_are_validated(overrides, message):
    config = TrainConfig(optimization={"objective": "mpp", **overrides})
    with pytest.raises(ValueError, match=message):
        config.validate()
