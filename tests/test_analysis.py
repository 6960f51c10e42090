"""Analysis, probes and figures: each number is checked against a closed form or an
independent numpy / scipy / scikit-learn computation."""

import keras
import numpy as np
import pytest
from scipy.spatial.distance import cdist
from scipy.special import softmax
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA

from helpers import randomise_weights, tiny_vit
from keras_vit.evaluation import analysis
from keras_vit.evaluation import probes


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _randomise(model, scale=0.3):
    randomise_weights(model, seed=0, scale=scale)
    return model


def _uniform(tokens, batch=2, heads=3):
    return np.full((batch, heads, tokens, tokens), 1.0 / tokens)


# Attention rollout


@pytest.mark.parametrize("head_fusion", analysis.HEAD_FUSIONS)
def test_rollout_of_identity_attention_is_identity(head_fusion):
    identity = np.broadcast_to(np.eye(17), (2, 3, 17, 17))
    rollout = analysis.attention_rollout([identity] * 3, head_fusion)
    np.testing.assert_allclose(rollout, np.broadcast_to(np.eye(17), (2, 17, 17)), atol=1e-12)


def test_rollout_of_uniform_attention_is_uniform_over_the_patches():
    # With U uniform (idempotent), ((U + I) / 2)^L = 2^-L I + (1 - 2^-L) U.
    layers, tokens = 3, 17
    rollout = analysis.attention_rollout([_uniform(tokens)] * layers)
    closed = 2.0**-layers * np.eye(tokens) + (1 - 2.0**-layers) / tokens
    np.testing.assert_allclose(rollout, np.broadcast_to(closed, rollout.shape), atol=1e-12)
    # The class token draws on every patch equally: a flat map.
    np.testing.assert_allclose(analysis.attention_map(rollout, (4, 4)), (1 - 2.0**-layers) / tokens)
    gap = analysis.attention_rollout([_uniform(16)] * layers)
    np.testing.assert_allclose(analysis.attention_map(gap, (4, 4)), 1 / 16, atol=1e-12)


def test_rollout_follows_abnar_zuidema_on_random_attention():
    rng = np.random.default_rng(0)
    attentions = [softmax(rng.normal(size=(2, 3, 5, 5)) * 3, axis=-1) for _ in range(3)]
    expected = np.eye(5)
    for a in attentions:  # the paper: 0.5 W_att + 0.5 I, layers multiplied in order
        expected = (0.5 * a.mean(axis=1) + 0.5 * np.eye(5)) @ expected
    np.testing.assert_allclose(analysis.attention_rollout(attentions), expected, atol=1e-12)

    fused = attentions[0].max(axis=1)
    fused[fused < np.sort(fused, axis=-1)[..., 2:3]] = 0.0  # discard the 2 smallest of 5
    fused = fused + np.eye(5)
    np.testing.assert_allclose(
        analysis.attention_rollout(attentions[:1], "max", discard_ratio=0.4),
        fused / fused.sum(-1, keepdims=True), atol=1e-12,
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: analysis.attention_rollout([_uniform(5)], "median"), r"Unknown head_fusion 'median'"),
        (lambda: analysis.attention_rollout([_uniform(5)], discard_ratio=1.0), r"discard_ratio must be in \[0, 1\), got 1.0"),
        (lambda: analysis.attention_rollout([_uniform(5), _uniform(6)]), r"layer 1 has shape \(2, 3, 6, 6\), layer 0 has"),
        (lambda: analysis.attention_rollout([np.ones((3, 5, 5))]), r"layer 0 has shape \(3, 5, 5\): expected \(batch, heads"),
        (lambda: analysis.mean_attention_distance([_uniform(19)], (4, 4), 8), r"19 tokens do not fit grid_size \(4, 4\)"),
    ],
)
def test_bad_attention_arguments_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# Mean attention distance


@pytest.mark.parametrize("grid_size, patch_size, prefix", [((4, 4), 8, 1), ((3, 5), 4, 0)])
def test_mean_attention_distance_of_uniform_attention_is_mean_centre_distance(
    grid_size, patch_size, prefix
):
    rows, cols = grid_size
    centres = [((r + 0.5) * patch_size, (c + 0.5) * patch_size) for r in range(rows) for c in range(cols)]
    closed = cdist(centres, centres).mean()
    tokens = rows * cols + prefix
    distance = analysis.mean_attention_distance([_uniform(tokens)] * 2, grid_size, patch_size)
    np.testing.assert_allclose(distance, np.full((2, 3), closed), rtol=1e-12)


def test_mean_attention_distance_of_a_fixed_offset_is_its_length():
    # Every patch attends only to the patch 1 row down and 2 columns right (mod the grid
    # for the last rows/columns, which is what the expected value averages).
    rows, cols, patch = 3, 5, 4
    attention = np.zeros((1, 1, rows * cols, rows * cols))
    expected = []
    for r in range(rows):
        for c in range(cols):
            target = ((r + 1) % rows, (c + 2) % cols)
            attention[0, 0, r * cols + c, target[0] * cols + target[1]] = 1.0
            expected.append(patch * np.hypot(target[0] - r, target[1] - c))
    distance = analysis.mean_attention_distance([attention], (rows, cols), patch)
    np.testing.assert_allclose(distance, [[np.mean(expected)]], rtol=1e-12)


# The attention model


def test_attention_weights_equal_softmax_of_the_layers_own_queries_and_keys():
    model = _randomise(tiny_vit())
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    _, attentions = analysis.attention_model(model)(images)
    blocks = [model.get_layer(f"encoderblock_{i}") for i in range(2)]
    block_inputs = keras.Model(model.input, [block.input for block in blocks])(images)
    for got, block, inputs in zip(attentions, blocks, block_inputs):
        inputs = _np(inputs).astype("float64")
        gamma, beta = (_np(w) for w in block.norm1.weights)
        normed = (inputs - inputs.mean(-1, keepdims=True)) / np.sqrt(inputs.var(-1, keepdims=True) + 1e-6)
        kernel, bias = (_np(w) for w in block.qkv.weights)
        qkv = (normed * gamma + beta) @ kernel + bias  # columns q | k | v, heads contiguous
        q, k, _ = (part.reshape(2, 17, 4, 8).transpose(0, 2, 1, 3) for part in np.split(qkv, 3, -1))
        expected = softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(8), axis=-1)
        assert tuple(got.shape) == (2, 4, 17, 17)
        np.testing.assert_allclose(_np(got), expected, atol=2e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(classifier="gap", representation_size=16, pos_embedding="sincos2d"),
        dict(include_top=False, pooling=False, pos_embedding="learned2d"),
        dict(resnet_stages=(), patch_size=2),  # hybrid: ResNet root (stride 4), then 2x2
    ],
)
def test_attention_model_outputs_equal_the_models_and_share_its_weights(overrides):
    model = _randomise(tiny_vit(**overrides), scale=0.1)
    images = np.random.default_rng(2).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    probe = analysis.attention_model(model)
    outputs, attentions = probe(images)
    np.testing.assert_allclose(_np(outputs), _np(model(images)), atol=1e-5)
    assert len(attentions) == 2
    assert {id(w) for w in probe.weights} == {id(w) for w in model.weights}
    assert analysis.patch_grid(model) == ((4, 4), 8)  # every case: 8x8-pixel tokens
    assert analysis.is_hybrid(model) == ("resnet_stages" in overrides)


def test_map_head_attention_equals_its_probes_softmax_over_the_tokens():
    """attention_model(pooling=True) of a classifier="map" model gives the MAP head's
    probe attention, checked against numpy from the head's own weights; attention_map
    of it (and of a rollout) weights the rows by its head mean."""
    model = _randomise(tiny_vit(classifier="map"), scale=0.3)
    images = np.random.default_rng(4).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    outputs, attentions, pooling = analysis.attention_model(model, pooling=True)(images)
    np.testing.assert_allclose(_np(outputs), _np(model(images)), atol=1e-5)
    head = model.get_layer("pool")
    tokens = _np(keras.Model(model.input, head.input)(images)).astype("float64")
    query = _np(head.probe)[0] @ _np(head.query.kernel) + _np(head.query.bias)  # (1, 32)
    key = (tokens @ _np(head.key_value.kernel) + _np(head.key_value.bias))[..., :32]
    q = query.reshape(1, 4, 8).transpose(1, 0, 2)  # (heads, 1, head_dim)
    k = key.reshape(2, 16, 4, 8).transpose(0, 2, 1, 3)  # (batch, heads, 16, head_dim)
    expected = softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(8), axis=-1)[:, :, 0]
    assert tuple(pooling.shape) == (2, 4, 16)
    np.testing.assert_allclose(_np(pooling), expected, atol=2e-5)
    np.testing.assert_allclose(analysis.attention_map(None, (4, 4), pooling=pooling),
                               expected.mean(1).reshape(2, 4, 4), atol=2e-5)
    rollout = analysis.attention_rollout(attentions)
    np.testing.assert_allclose(analysis.attention_map(rollout, (4, 4), pooling=pooling),
                               np.einsum("bt,bts->bs", expected.mean(1), rollout).reshape(2, 4, 4),
                               atol=2e-5)


def test_pooling_attention_of_a_model_without_a_map_head_is_refused():
    with pytest.raises(ValueError, match=r"Model 'vit' has no MAP head \(classifier='map', "
                       r"pooled\), so it has no pooling attention"):
        analysis.attention_model(tiny_vit(name="vit"), pooling=True)
    with pytest.raises(ValueError, match=r"pooling attention has shape \(1, 4, 17\): expected "
                       r"\(batch, heads, 16\)"):
        analysis.attention_map(np.ones((1, 16, 16)), (4, 4), pooling=np.ones((1, 4, 17)))


def test_attention_model_rejects_a_model_without_transformer_blocks():
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match="Model 'plain' has no TransformerBlock layers"):
        analysis.attention_model(dense)


# Position embeddings and patch-embedding filters


def test_sincos2d_similarity_peaks_on_the_diagonal_and_decays_with_distance():
    similarity = analysis.position_embedding_similarity(tiny_vit(pos_embedding="sincos2d"))
    assert similarity.shape == (4, 4, 4, 4)
    flat = similarity.reshape(16, 16)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-6)
    assert flat[~np.eye(16, dtype=bool)].max() < 1 - 1e-3  # every off-diagonal entry is lower
    for i in range(4):
        for j in range(4):  # strictly decreasing moving away along a row or a column
            assert np.all(np.diff(similarity[i, j, i, j:]) < 0)
            assert np.all(np.diff(similarity[i, j, i, : j + 1]) > 0)
            assert np.all(np.diff(similarity[i, j, i:, j]) < 0)
    # Closed form: sin/cos pairs give cos(w * offset), averaged over the 2 * 8 pairs.
    omega = 1.0 / 10000 ** (np.arange(8) / 7)  # big_vision: temperature ** -(i / (D/4 - 1))
    dy, dx = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    closed = (np.cos(omega * dy[..., None]) + np.cos(omega * dx[..., None])).mean(-1) / 2
    np.testing.assert_allclose(similarity[0, 0], closed, atol=1e-6)


def test_learned2d_similarity_is_cosine_of_row_and_column_tables():
    model = _randomise(tiny_vit(pos_embedding="learned2d"))
    encoder = model.get_layer("patch_encoder")
    rows, cols = _np(encoder.row_position)[:, 0], _np(encoder.col_position)[0]  # (4, 16) each
    table = np.concatenate([np.repeat(rows, 4, axis=0), np.tile(cols, (4, 1))], axis=1)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    np.testing.assert_allclose(
        analysis.position_embedding_similarity(model).reshape(16, 16), table @ table.T, atol=1e-6
    )
    with pytest.raises(ValueError, match="pos_embedding='none': there are no position embeddings"):
        analysis.position_embedding_similarity(tiny_vit(pos_embedding="none"))


def test_patch_embedding_components_are_orthonormal_principal_components():
    model = _randomise(tiny_vit())
    components = analysis.patch_embedding_components(model, n=28)
    assert components.shape == (28, 8, 8, 3)
    flat = components.reshape(28, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(28), atol=1e-10)
    filters = _np(model.get_layer("patch_encoder").projection.kernel).T.astype("float64")
    reference = PCA(n_components=28).fit(filters).components_
    np.testing.assert_allclose(np.abs(np.sum(flat * reference, axis=1)), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match=r"n=33 principal components requested: expected an integer from 1 to 32"):
        analysis.patch_embedding_components(model, n=33)
    with pytest.raises(ValueError, match=r"is a hybrid: its patch embedding filters act on ResNet features"):
        analysis.patch_embedding_components(tiny_vit(resnet_stages=(), patch_size=2))


# Robustness probes


@pytest.fixture(scope="module")
def digits32():
    """scikit-learn digits upsampled to 32x32 RGB in [-1, 1], the tiny model's input."""
    digits = load_digits()
    images = np.kron(digits.images[:96], np.ones((4, 4)))[..., None] / 8.0 - 1.0
    return np.repeat(images, 3, axis=-1).astype("float32"), digits.target[:96]


def test_probes_at_zero_drop_and_grid_one_equal_clean_accuracy(digits32):
    import tensorflow as tf

    images, labels = digits32
    model = _randomise(tiny_vit(), scale=0.5)
    clean = np.mean(_np(model(images)).argmax(-1) == labels)
    assert 0 < clean < 1  # random weights: a non-trivial accuracy to compare
    settings = dict(drop_fractions=[0.0, 0.5], shuffle_grids=[1, 2], batch_size=32)
    results = probes.robustness_probes(model, images, labels, **settings)
    assert results["examples"] == 96
    assert results["accuracy"] == results["occlusion"][0.0] == results["shuffle"][1] == clean
    # A tf.data source with the same batches and one-hot labels gives the same numbers.
    dataset = tf.data.Dataset.from_tensor_slices((images, np.eye(10)[labels])).batch(32)
    assert probes.robustness_probes(model, dataset, **settings) == results
    with pytest.raises(ValueError, match="Robustness probes need labels"):
        probes.robustness_probes(model, images, **settings)


def test_drop_patches_fills_exactly_the_requested_fraction():
    images = np.random.default_rng(0).uniform(0.5, 1, (3, 32, 32, 3)).astype("float32")
    for fraction, count in [(0.0, 0), (0.3, 5), (0.5, 8), (1.0, 16)]:
        dropped = probes.drop_patches(images, fraction, 8, rng=np.random.default_rng(1))
        patches = dropped.reshape(3, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(3, 16, -1)
        originals = images.reshape(3, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(3, 16, -1)
        filled = np.all(patches == 0, axis=-1)
        assert filled.sum(axis=1).tolist() == [count] * 3
        np.testing.assert_array_equal(patches[~filled], originals[~filled])
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\], got 1.5"):
        probes.drop_patches(images, 1.5, 8)


def test_shuffle_patches_permutes_cells_and_grid_one_is_identity():
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(probes.shuffle_patches(images, 1, rng=0), images)
    shuffled = probes.shuffle_patches(images, 4, rng=0)

    def cells(x):
        return x.reshape(2, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 16, -1)

    for before, after in zip(cells(images), cells(shuffled)):
        order = [int(np.flatnonzero(np.all(before == cell, axis=1))[0]) for cell in after]
        assert sorted(order) == list(range(16)) and order != list(range(16))
    with pytest.raises(ValueError, match=r"Shuffle grid 3 must be a positive integer dividing the image size 32x32"):
        probes.shuffle_patches(images, 3)


# Figures


def test_figures_are_written_as_png(tmp_path):
    from matplotlib.image import imread

    from keras_vit import figures

    model = _randomise(tiny_vit(), scale=0.1)
    images = np.random.default_rng(3).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    written = figures.visualize(model, images, tmp_path)
    results = {"accuracy": 0.5, "occlusion": {0.0: 0.5, 0.5: 0.3}, "shuffle": {1: 0.5, 2: 0.4},
               "examples": 10}
    written["probes"] = figures.plot_probes(results, tmp_path / "probes.png")
    assert sorted(written) == ["attention", "distance", "filters", "position", "probes"]
    # A map model (no class token): the maps through its MAP head's probe.
    written["map"] = figures.visualize(_randomise(tiny_vit(classifier="map"), scale=0.1),
                                       images, tmp_path / "map")["attention"]
    for path in written.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(path)
        assert pixels.ndim == 3 and min(pixels.shape[:2]) > 200 and pixels.std() > 0
