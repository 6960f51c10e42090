"""Few-shot linear evaluation: the closed-form solver against numpy and scikit-learn,
per-class sampling, the shots x seeds driver, feature extraction, table and plot, and
the pretrained-versus-random comparison on digits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.linear_model import Ridge
from sklearn.model_selection import train_test_split

import keras_vit
from references import whitened_with_bias
from keras_vit.evaluation import fewshot
from keras_vit.evaluation.features import representation_model
from helpers import randomise_weights, tiny_vit

ROOT = Path(__file__).resolve().parents[1]


def _blobs(num_classes, per_class, dim, seed=0, spread=2.0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(num_classes), per_class)
    centres = rng.normal(size=(num_classes, dim)) * spread
    features = centres[labels] + rng.normal(size=(len(labels), dim)) * rng.uniform(0.5, 3, dim)
    return features, labels



@pytest.mark.parametrize("n, d", [(60, 10), (12, 40)], ids=["N>D", "D>N"])
@pytest.mark.parametrize("l2", [1.0, 2.0**10])
def test_solver_equals_numpy_solve_and_sklearn_ridge(n, d, l2):
    features, labels = _blobs(4, n // 4, d)
    test_features, test_labels = _blobs(4, 10, d, seed=1)
    x, x_test = whitened_with_bias(features, test_features)
    targets = 2.0 * np.eye(4)[labels] - 1.0
    primal = np.linalg.solve(x.T @ x + l2 * np.eye(d + 1), x.T @ targets)
    dual = x.T @ np.linalg.solve(x @ x.T + l2 * np.eye(n), targets)
    sklearn = Ridge(alpha=l2, fit_intercept=False, solver="svd").fit(x, targets).coef_.T

    probe = fewshot.RidgeProbe(features, labels)
    weights = probe.weights(l2)
    scale = np.abs(primal).max()
    for reference in (primal, dual, sklearn):
        np.testing.assert_allclose(weights, reference, rtol=1e-6, atol=1e-9 * scale)
    np.testing.assert_allclose(
        probe.decision_function(test_features, l2), x_test @ primal, rtol=1e-6, atol=1e-9 * scale
    )
    expected_accuracy = np.mean((x_test @ sklearn).argmax(1) == test_labels)
    accuracy = fewshot.linear_fewshot_accuracy(features, labels, test_features, test_labels, l2=l2)
    assert accuracy == expected_accuracy


def test_labels_need_not_be_contiguous():
    features, labels = _blobs(3, 8, 5)
    shifted = fewshot.RidgeProbe(features, labels + 5)
    plain = fewshot.RidgeProbe(features, labels)
    np.testing.assert_array_equal(shifted.predict(features), plain.predict(features) + 5)


def test_solver_rejects_bad_input():
    features, labels = _blobs(3, 4, 5)
    with pytest.raises(ValueError, match=r"l2 must be a positive number, got 0"):
        fewshot.linear_fewshot_accuracy(features, labels, features, labels, l2=0)
    with pytest.raises(ValueError, match=r"Got 12 train features but 11 labels"):
        fewshot.RidgeProbe(features, labels[:-1])
    with pytest.raises(ValueError, match=r"hold 1 class\(es\) \(\[2\]\): expected at least 2"):
        fewshot.RidgeProbe(features, np.full(12, 2))
    with pytest.raises(ValueError, match=r"features have 4 dimensions, the probe was fit on 5"):
        fewshot.RidgeProbe(features, labels).predict(features[:, :4])
    with pytest.raises(ValueError, match=r"train features contain NaN"):
        fewshot.RidgeProbe(np.where(features > 1, np.nan, features), labels)


def test_sampling_takes_exactly_shots_per_class_reproducibly():
    labels = np.repeat([3, 5, 8], [10, 25, 40])
    for shots in (1, 5, 10):
        indices = fewshot.sample_shots(labels, shots, seed=0)
        assert len(set(indices.tolist())) == len(indices)
        assert {c: int(np.sum(labels[indices] == c)) for c in (3, 5, 8)} == {3: shots, 5: shots, 8: shots}
        np.testing.assert_array_equal(indices, fewshot.sample_shots(labels, shots, seed=0))
        assert not np.array_equal(indices, fewshot.sample_shots(labels, shots, seed=1))
    # For one seed, a smaller sample is part of a larger one (as big_vision draws them).
    assert set(fewshot.sample_shots(labels, 5, seed=2)) <= set(fewshot.sample_shots(labels, 10, seed=2))


def test_too_few_examples_names_the_class():
    labels = np.repeat([0, 1, 7], [30, 30, 4])
    with pytest.raises(ValueError, match=r"Class 7 has 4 training example\(s\), fewer than the 5 shots"):
        fewshot.sample_shots(labels, 5)
    features = np.random.default_rng(0).normal(size=(64, 3))
    with pytest.raises(ValueError, match=r"Class 7 has 3 training example\(s\) outside the 1 held out"):
        fewshot.fewshot_evaluate(features, labels, features, labels, shots=(4,), l2="sweep")
    with pytest.raises(ValueError, match=r"shots must be positive integers, got \[0\]"):
        fewshot.fewshot_evaluate(features, labels, features, labels, shots=(0,))


def test_driver_scores_each_seed_on_its_sample():
    train, train_labels = _blobs(5, 40, 12)
    test, test_labels = _blobs(5, 20, 12, seed=3)
    result = fewshot.fewshot_evaluate(train, train_labels, test, test_labels, shots=(1, 5), seeds=3, l2=8.0)
    assert json.loads(json.dumps(result)) == result
    for i, shots in enumerate((1, 5)):
        expected = [
            fewshot.linear_fewshot_accuracy(
                train[idx], train_labels[idx], test, test_labels, l2=8.0
            )
            for idx in (fewshot.sample_shots(train_labels, shots, seed=s) for s in range(3))
        ]
        assert result["accuracy"][i] == expected
        assert result["mean"][i] == pytest.approx(np.mean(expected))
        assert result["std"][i] == pytest.approx(np.std(expected))
    assert result["l2"] == [8.0, 8.0]


def test_sweep_chooses_l2_on_held_out_train_examples_only():
    train, train_labels = _blobs(4, 40, 30, spread=0.7)
    test, test_labels = _blobs(4, 30, 30, seed=5, spread=0.7)
    kwargs = dict(shots=(2, 10), l2="sweep")
    result = fewshot.fewshot_evaluate(train, train_labels, test, test_labels, **kwargs)
    # The test split never influences the choice: a shuffled test set chooses the same l2.
    flipped = fewshot.fewshot_evaluate(train, train_labels, test, test_labels[::-1], **kwargs)
    assert result["l2"] == flipped["l2"]
    assert result["l2_candidates"] == [2.0**i for i in range(-10, 20)]
    for i, chosen in enumerate(result["l2"]):
        holdout = result["holdout_accuracy"][i]
        assert chosen == result["l2_candidates"][int(np.argmax(holdout))]
    print("\nchosen l2:", result["l2"])


def test_features_are_the_pre_logits_output():
    model = tiny_vit(representation_size=24)
    rng = randomise_weights(model, seed=0)
    headless = tiny_vit(representation_size=24, include_top=False)
    headless.set_weights(model.get_weights()[:-2])  # all but the head's kernel and bias
    images = rng.uniform(-1, 1, (7, 32, 32, 3)).astype("float32")
    labels = np.arange(7) % 3
    expected = keras.ops.convert_to_numpy(headless(images))

    features, out_labels = fewshot.extract_features(model, images, labels, batch_size=3)
    np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out_labels, labels)
    batched = tf.data.Dataset.from_tensor_slices((images, np.eye(3)[labels])).batch(4)
    features, out_labels = fewshot.extract_features(model, batched)
    np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out_labels, labels)
    unbatched = tf.data.Dataset.from_tensor_slices(images)
    features, out_labels = fewshot.extract_features(model, unbatched, batch_size=5)
    np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)
    assert out_labels is None
    assert representation_model(tiny_vit()).output.shape == (None, 32)


def test_feature_extraction_errors_name_the_problem():
    tokens = tiny_vit(include_top=False, pooling=False)
    with pytest.raises(ValueError, match=r"has no 'pre_logits' or 'pool' layer"):
        representation_model(tokens)
    with pytest.raises(ValueError, match=r"Layer 'encoder_norm' outputs shape \(None, 17, 32\)"):
        representation_model(tiny_vit(), layer="encoder_norm")
    with pytest.raises(ValueError, match=r"has no layer 'logits'"):
        representation_model(tiny_vit(), layer="logits")
    with pytest.raises(ValueError, match=r"Got 2 images but 3 labels"):
        fewshot.extract_features(tiny_vit(), np.zeros((2, 32, 32, 3)), [0, 1, 2])


@pytest.mark.slow  # a process per backend
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_feature_extraction_from_tf_data_on(backend):
    script = (
        "import numpy as np, tensorflow as tf, keras, keras_vit\n"
        "from keras_vit import fewshot\n"
        "kw = dict(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2,"
        " mlp_dim=32)\n"
        "m = keras_vit.ViT(num_classes=3, **kw)\n"
        "headless = keras_vit.ViT(include_top=False, **kw)\n"
        "headless.set_weights(m.get_weights()[:-2])\n"
        "x = np.random.default_rng(0).uniform(-1, 1, (5, 16, 16, 3)).astype('float32')\n"
        "data = tf.data.Dataset.from_tensor_slices((x, np.arange(5))).batch(2)\n"
        "f, y = fewshot.extract_features(m, data)\n"
        "want = keras.ops.convert_to_numpy(headless(x))\n"
        "np.testing.assert_allclose(f, want, rtol=1e-5, atol=1e-6)\n"
        "assert y.tolist() == [0, 1, 2, 3, 4]\n"
        "print(keras.backend.backend(), 'ok')\n"
    )
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"{backend} ok" in result.stdout


def test_names_from_before_the_split_are_the_new_homes():
    from keras_vit import figures
    from keras_vit.evaluation import features, fewshot_report, ridge

    assert fewshot.extract_features is features.extract_features is keras_vit.extract_features
    assert fewshot.RidgeProbe is ridge.RidgeProbe is keras_vit.RidgeProbe
    assert fewshot.linear_fewshot_accuracy is ridge.linear_fewshot_accuracy
    assert keras_vit.linear_fewshot_accuracy is ridge.linear_fewshot_accuracy
    assert fewshot.DEFAULT_L2 == ridge.DEFAULT_L2 == 2.0**10
    assert fewshot.format_table is fewshot_report.format_table
    assert fewshot.save_results is fewshot_report.save_results
    assert fewshot.plot_fewshot is figures.plot_fewshot
    assert keras_vit.fewshot_evaluate is fewshot.fewshot_evaluate
    with pytest.raises(AttributeError, match="has no attribute 'plot_fewshots'"):
        fewshot.plot_fewshots


def test_table_json_and_plot(tmp_path):
    train, train_labels = _blobs(3, 30, 6)
    result = fewshot.fewshot_evaluate(train, train_labels, train, train_labels, shots=(1, 5), seeds=2)
    table = fewshot.format_table({"blobs": result, "again": result}, references={"fine-tuned": {"blobs": 0.9}})
    rows = [[cell.strip() for cell in line.split("|")] for line in table.splitlines()]
    assert rows[0] == ["shots", "blobs", "again"]
    cell = f"{100 * result['mean'][0]:.1f} ± {100 * result['std'][0]:.1f}%"
    assert rows[2] == ["1", cell, cell]
    assert rows[3][0] == "5"
    assert rows[4] == ["fine-tuned", "90.0%", "-"]
    single = [[c.strip() for c in line.split("|")] for line in fewshot.format_table(result).splitlines()]
    assert single[0] == ["shots", "accuracy", "l2"] and single[2][2] == "2^10"
    path = tmp_path / "fewshot.png"
    fewshot.plot_fewshot({"blobs": result}, path, references={"fine-tuned": 0.9})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # trains to an accuracy
def test_pretrained_encoder_beats_random_weights_on_unseen_digits():
    digits = load_digits()
    images = digits.images[..., None].astype("float32") / 8.0 - 1.0  # [0, 16] -> [-1, 1]
    labels = digits.target
    seen = labels < 5
    x_train, x_test, y_train, y_test = train_test_split(
        images[~seen], labels[~seen], test_size=0.5, random_state=0, stratify=labels[~seen]
    )
    encoder = keras_vit.ViT(
        image_size=8, patch_size=2, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64,
        num_classes=5, channels=1,
    )

    def ten_shot_accuracy():
        result = fewshot.evaluate_model(
            encoder, (x_train, y_train), (x_test, y_test), shots=(10,), seeds=3, l2="sweep"
        )
        return result["mean"][0]

    random_accuracy = ten_shot_accuracy()
    inputs = keras.Input((8, 8, 1))
    shifted = keras.layers.RandomTranslation(0.15, 0.15, fill_mode="constant", fill_value=-1.0)(inputs)
    trainer = keras.Model(inputs, encoder(shifted))
    trainer.compile(
        keras.optimizers.Adam(2e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    trainer.fit(images[seen], labels[seen], batch_size=64, epochs=10, verbose=0)
    pretrained_accuracy = ten_shot_accuracy()
    print(f"\n10-shot accuracy on digits 5-9: random weights {random_accuracy:.3f}, "
          f"pretrained on 0-4 {pretrained_accuracy:.3f}")
    assert pretrained_accuracy >= random_accuracy + 0.08


def _digits_arrays(split_classes):
    """The digits source's train/test split and [-1, 1] scaling, written out with sklearn."""
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0))[..., None] / 127.5 - 1.0
    x_train, x_test, y_train, y_test = train_test_split(
        images.astype("float32"), digits.target, test_size=0.2, random_state=0,
        stratify=digits.target,
    )
    keep_train, keep_test = np.isin(y_train, split_classes), np.isin(y_test, split_classes)
    return (x_train[keep_train], y_train[keep_train]), (x_test[keep_test], y_test[keep_test])


def test_fewshot_command_writes_table_json_and_plot(tmp_path, capsys):
    from keras_vit import cli

    model = keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2,
                          mlp_dim=32, num_classes=10, channels=1)
    path = tmp_path / "tiny.keras"
    model.save(path)
    out = tmp_path / "fewshot"
    argv = ["fewshot", "--from", str(path), "--data", "digits", "--classes", "5-9",
            "--shots", "1,3,10", "--seeds", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("|")] for line in printed.splitlines() if "|" in line]
    assert rows[0] == ["shots", "tiny.keras", "l2"]
    assert [row[0] for row in rows[1:]] == ["1", "3", "10"]

    saved = json.loads((out / "fewshot.json").read_text())["runs"]["tiny.keras"]
    assert saved["shots"] == [1, 3, 10] and saved["seeds"] == [0, 1]
    assert saved["l2"] == [2.0**10] * 3 and saved["class_names"] == ["5", "6", "7", "8", "9"]
    # The same evaluation on arrays prepared independently of keras_vit.data.
    expected = fewshot.evaluate_model(model, *_digits_arrays([5, 6, 7, 8, 9]), shots=(1, 3, 10), seeds=2)
    assert (saved["num_train"], saved["num_test"]) == (expected["num_train"], expected["num_test"])
    np.testing.assert_allclose(saved["accuracy"], expected["accuracy"])
    assert rows[1][1] == f"{100 * expected['mean'][0]:.1f} ± {100 * expected['std'][0]:.1f}%"
    table = [line for line in printed.splitlines() if "|" in line or "-+-" in line]
    assert (out / "fewshot.txt").read_text().splitlines() == table
    assert (out / "fewshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--shots", "0,x"], r"--shots expects comma-separated positive integers .*got '0,x'"),
        (["--seeds", "0"], r"--seeds expects comma-separated positive integers .*got '0'"),
        (["--seeds", "2,3"], r"--seeds expects one positive integer, got '2,3'"),
        (["--l2", "big"], r"--l2 expects a positive number or 'sweep', got 'big'"),
        (["--l2", "-1"], r"l2 must be a positive number, got -1.0"),
        (["--classes", "5-12"], r"classes='5-12' names class\(es\) \[10, 11, 12\]"),
        (["--set", "shots=(1,200)"], r"Class 5 has 14\d training example\(s\), fewer than the 200 shots"),
    ],
)
def test_fewshot_command_names_bad_arguments(tmp_path, capsys, flags, message):
    import re

    from keras_vit import cli

    path = tmp_path / "tiny.keras"
    keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2,
                  mlp_dim=32, channels=1).save(path)
    argv = ["fewshot", "--from", str(path), "--classes", "5-9", "--out", str(tmp_path), *flags]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert re.search(message, error) and "Traceback" not in error, error
