"""Layer tests: each number is checked against an independent numpy computation."""

import math

import keras
import numpy as np
import pytest
from scipy.special import erf

from keras_vit import layers as L
from keras_vit.backend.erf import erf as backend_erf
from keras_vit.layers.attention import query_blocks
from helpers import randomise_weights

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)


def _np(x):
    return keras.ops.convert_to_numpy(x)


@keras.saving.register_keras_serializable(package="keras_vit_tests")
class ReluMLP(L.MLP):
    """An MLP of another activation, for a block to be given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.activation = keras.ops.relu


def test_patches_order_is_row_major_and_row_column_channel():
    images = np.random.default_rng(0).normal(size=(2, 12, 8, 3)).astype("float32")
    patches = _np(L.Patches(4)(images))
    assert patches.shape == (2, 6, 48)
    for i in range(3):
        for j in range(2):
            expected = images[:, 4 * i : 4 * i + 4, 4 * j : 4 * j + 4, :].reshape(2, -1)
            np.testing.assert_array_equal(patches[:, i * 2 + j], expected)


def test_patches_plus_projection_equals_patch_conv():
    rng = np.random.default_rng(1)
    images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    kernel = rng.normal(scale=0.05, size=(8, 8, 3, 32)).astype("float32")
    bias = rng.normal(size=(32,)).astype("float32")
    conv = keras.layers.Conv2D(32, 8, strides=8, padding="valid")
    conv.build(images.shape)
    conv.set_weights([kernel, bias])
    expected = _np(conv(images)).reshape(2, 16, 32)

    encoder = L.PatchEncoder(32, grid_size=4, pos_embedding="none")
    encoder.build((None, 16, 8 * 8 * 3))
    encoder.projection.set_weights([kernel.reshape(-1, 32), bias])
    got = _np(encoder(L.Patches(8)(images)))
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_sincos2d_table_matches_big_vision_closed_form():
    rows, cols, width = 3, 5, 16
    table = _np(L.sincos_2d_table((rows, cols), width))[0]
    omega = 1.0 / 10000 ** (np.arange(4) / 3)
    for r in range(rows):
        for c in range(cols):
            expected = np.concatenate(
                [np.sin(c * omega), np.cos(c * omega), np.sin(r * omega), np.cos(r * omega)]
            )
            np.testing.assert_allclose(table[r * cols + c], expected, atol=1e-6)


def test_learned2d_table_concatenates_row_and_column_tables():
    encoder = L.PatchEncoder(8, grid_size=(2, 3), pos_embedding="learned2d")
    encoder.build((None, 6, 12))
    rows, cols = _np(encoder.row_position), _np(encoder.col_position)
    assert rows.shape == (2, 1, 4) and cols.shape == (1, 3, 4)
    table = _np(encoder.position_table())[0]
    for r in range(2):
        for c in range(3):
            np.testing.assert_array_equal(table[r * 3 + c], np.concatenate([rows[r, 0], cols[0, c]]))


def test_class_token_is_zero_initialised_and_prepended():
    tokens = np.random.default_rng(2).normal(size=(3, 5, 8)).astype("float32")
    out = _np(L.ClassToken()(tokens))
    assert out.shape == (3, 6, 8)
    np.testing.assert_array_equal(out[:, 0], 0.0)
    np.testing.assert_array_equal(out[:, 1:], tokens)


def test_drop_path_drops_whole_samples_and_rescales():
    x = np.ones((2000, 3, 4), "float32")
    out = _np(L.DropPath(0.25, seed=1)(x, training=True))
    per_sample = out.reshape(2000, -1)
    assert set(np.unique(per_sample)) <= {np.float32(0.0), np.float32(1.0) / np.float32(0.75)}
    assert np.all(per_sample.min(axis=1) == per_sample.max(axis=1))
    assert abs((per_sample[:, 0] == 0).mean() - 0.25) < 0.04
    np.testing.assert_array_equal(_np(L.DropPath(0.25)(x, training=False)), x)


def _layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def _numpy_gelu(h, approximate=False):
    if approximate:
        return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    return 0.5 * h * (1 + erf(h / np.sqrt(2)))


def _numpy_block(block, x, heads, activation=_numpy_gelu):
    """The pre-LN block written out in numpy from the paper's equations (with layer
    scale where the block has its weights), `heads` attention heads, GELU or
    `activation` in the MLP."""
    w = {v.path.split("/", 1)[1]: _np(v) for v in block.weights}
    scales = [w.get(f"layer_scale_{branch}", 1.0) for branch in ("attention", "mlp")]
    dim = x.shape[-1]
    head_dim = dim // heads
    h = _layer_norm(x, w["norm1/gamma"], w["norm1/beta"])
    qkv = h @ w["qkv/kernel"] + w["qkv/bias"]
    q, k, v = (qkv[..., i * dim : (i + 1) * dim] for i in range(3))
    split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, head_dim).transpose(0, 2, 1, 3)
    q, k, v = split(q), split(k), split(v)
    logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attended = (weights @ v).transpose(0, 2, 1, 3).reshape(x.shape)
    x = x + scales[0] * (attended @ w["attention_output/kernel"] + w["attention_output/bias"])
    h = _layer_norm(x, w["norm2/gamma"], w["norm2/beta"])
    h = activation(h @ w["mlp_fc1/kernel"] + w["mlp_fc1/bias"])
    return x + scales[1] * (h @ w["mlp_fc2/kernel"] + w["mlp_fc2/bias"]), weights


def _randomised(layer, seed=3):
    randomise_weights(layer, seed, scale=0.3)
    return layer


def _random_block(batch, seed):
    """A randomised `TransformerBlock(num_heads=4, mlp_dim=16)` built for `(batch, 9, 32)`
    tokens, and random tokens of that shape."""
    x = np.random.default_rng(seed).normal(size=(batch, 9, 32)).astype("float32")
    block = L.TransformerBlock(num_heads=4, mlp_dim=16)
    block.build(x.shape)
    return _randomised(block, seed=seed + 1), x


@pytest.mark.parametrize("approximate", [False, True])
def test_transformer_block_matches_numpy_reference(approximate):
    x = np.random.default_rng(4).normal(size=(2, 7, 16)).astype("float32")
    block = L.TransformerBlock(num_heads=4, mlp_dim=32, gelu_approximate=approximate)
    block.build(x.shape)
    _randomised(block)
    expected, expected_weights = _numpy_block(
        block, x.astype("float64"), heads=4, activation=lambda h: _numpy_gelu(h, approximate)
    )
    out, weights = block(x, return_attention=True)
    np.testing.assert_allclose(_np(block(x)), expected, atol=1e-4)
    np.testing.assert_allclose(_np(out), expected, atol=1e-4)
    np.testing.assert_allclose(_np(weights), expected_weights, atol=1e-5)


def test_fused_and_explicit_attention_paths_agree():
    block, x = _random_block(3, seed=5)
    fused = _np(block(x))
    explicit, _ = block(x, return_attention=True)
    np.testing.assert_allclose(fused, _np(explicit), atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's autograd graph")
def test_fused_attention_splits_qkv_without_indexed_slices():
    # Three indexed slices of q|k|v (SelectBackward0) each fill a zero tensor of q|k|v's
    # size in the backward pass and the three are summed; unbind's backward is one
    # stack. The gradients equal the explicit path's.
    block, x = _random_block(2, seed=7)
    fused = block(keras.ops.convert_to_tensor(x).requires_grad_(), training=True)
    nodes, stack = set(), [fused.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in nodes:
            nodes.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    names = {type(node).__name__ for node in nodes}
    assert "SelectBackward0" not in names and "UnbindBackward0" in names, names
    _, fused_gradient = _value_and_gradient(lambda v: block(v, training=True), x)
    _, explicit_gradient = _value_and_gradient(
        lambda v: block(v, training=True, return_attention=True)[0], x
    )
    np.testing.assert_allclose(fused_gradient, explicit_gradient, atol=1e-5)


def _value_and_gradient(fn, x):
    """`fn(x)` and the gradient of its sum, by the backend's own autodiff."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return _np(fn(x)), np.asarray(jax.grad(lambda v: fn(v).sum())(x))
    if backend == "torch":
        v = keras.ops.convert_to_tensor(x).requires_grad_()  # on Keras' device
        y = fn(v)
        y.sum().backward()
        return _np(y), _np(v.grad)
    import tensorflow as tf

    v = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(v)
        y = fn(v)
    return _np(y), tape.gradient(y, v).numpy()


def test_erf_and_its_gradient_match_the_closed_forms():
    # Past the clip at 3.92 too, where float32 erf is +-1 and its slope ~1e-7.
    x = np.linspace(-6, 6, 24001).astype("float32")
    value, gradient = _value_and_gradient(backend_erf, x)
    exact = x.astype("float64")
    np.testing.assert_allclose(value, erf(exact), rtol=0, atol=5e-7)
    slope = 2 / np.sqrt(np.pi) * np.exp(-(exact**2))
    np.testing.assert_allclose(gradient, slope, rtol=0, atol=5e-7)
    # 16-bit inputs are computed in float32 and rounded once.
    half = _np(backend_erf(keras.ops.convert_to_tensor(x, "bfloat16")))
    np.testing.assert_allclose(half.astype("float64"), erf(exact), rtol=0, atol=4e-3)


def test_layer_norm_trains_as_keras_layer_norm():
    # Under JAX the training gradient is the closed form (for memory); elsewhere it is
    # Keras' formula. One SGD step of Dense -> norm -> Dense moves every weight as the
    # same model with Keras' own layer does, whose gradient is the backend's autodiff.
    rng = np.random.default_rng(11)
    x = (rng.normal(size=(4, 5, 8)) * 3 + 1).astype("float32")
    y = rng.normal(size=(4, 5, 3)).astype("float32")

    def stepped(norm):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5, 8))
        model = keras.Model(inputs, keras.layers.Dense(3)(norm(keras.layers.Dense(8)(inputs))))
        norm.set_weights(norm_weights)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.train_on_batch(x, y)
        return model.get_weights()

    norm_weights = [rng.normal(size=8).astype("float32") for _ in range(2)]
    ours = stepped(L.LayerNormalization(epsilon=1e-6))
    reference = stepped(keras.layers.LayerNormalization(epsilon=1e-6))
    for got, expected in zip(ours, reference):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert np.abs(ours[2] - norm_weights[0]).max() > 1e-3  # gamma moved


def test_long_sequences_attend_in_exact_query_blocks():
    # 300 tokens: past the length at which JAX attends in blocks of queries.
    x = np.random.default_rng(7).normal(size=(1, 300, 16)).astype("float32")
    block = L.TransformerBlock(num_heads=2, mlp_dim=16)
    block.build(x.shape)
    _randomised(block, seed=8)
    expected, _ = _numpy_block(block, x.astype("float64"), heads=2)
    np.testing.assert_allclose(_np(block(x)), expected, atol=1e-4)
    rows = [row for start, stop in query_blocks(300) for row in range(start, stop)]
    assert rows == list(range(300))


LAYERS = {
    "Patches": (lambda: L.Patches(4), (2, 8, 8, 3)),
    "PatchEncoder-learned": (lambda: L.PatchEncoder(16, (2, 2)), (2, 4, 48)),
    "PatchEncoder-learned2d": (lambda: L.PatchEncoder(16, (2, 2), "learned2d"), (2, 4, 48)),
    "PatchEncoder-sincos2d": (lambda: L.PatchEncoder(16, (2, 2), "sincos2d"), (2, 4, 48)),
    "ClassToken": (lambda: L.ClassToken(use_position=True), (2, 4, 16)),
    "TokenPooling": (lambda: L.TokenPooling("gap"), (2, 4, 16)),
    "DropPath": (lambda: L.DropPath(0.1, seed=3), (2, 4, 16)),
    "TransformerBlock": (
        lambda: L.TransformerBlock(2, 32, 0.1, 0.1, 0.1, gelu_approximate=True),
        (2, 4, 16),
    ),
    "TransformerBlock-composed": (
        lambda: L.TransformerBlock(
            attention=L.Attention(4, dropout_rate=0.1),
            mlp=ReluMLP(32, norm_epsilon=1e-5, dropout_rate=0.2),
            dropout_rate=0.1, drop_path_rate=0.1, layer_scale_init=1e-6,
        ),
        (2, 4, 16),
    ),
    "TransformerBlock-given-attention": (
        lambda: L.TransformerBlock(
            mlp_dim=32, mlp="swiglu", attention=L.Attention(2, dropout_rate=0.1), dropout_rate=0.1
        ),
        (2, 4, 16),
    ),
    "Attention": (lambda: L.Attention(2, dropout_rate=0.1), (2, 4, 16)),
    "MLP": (lambda: L.MLP(32, kind="swiglu", norm_epsilon=1e-5, dropout_rate=0.1), (2, 4, 16)),
}


def test_block_variables_keep_the_paths_and_order_of_one_flat_layer():
    """The block's attention and MLP add no name to its variables' paths, and its
    variables are listed in the order of the block that held its Dense layers itself
    (what `.keras` files, optimizer states and run backups are read by)."""
    block = L.TransformerBlock(2, 32, 0.1, 0.1, 0.1, layer_scale_init=1e-6, mlp_norm=True,
                               name="block")
    block.build((2, 4, 16))
    layers = ["mlp_norm", "norm1", "norm2", "mlp_fc1", "qkv", "attention_output", "mlp_fc2"]
    own = {"mlp_norm": ("gamma", "beta"), "norm1": ("gamma", "beta"), "norm2": ("gamma", "beta")}
    expected = ["block/layer_scale_attention", "block/layer_scale_mlp"] + [
        f"block/{layer}/{name}" for layer in layers for name in own.get(layer, ("kernel", "bias"))
    ]
    assert [v.path for v in block.weights] == expected
    assert [layer.name for layer in block.projections()] == list(L.TransformerBlock.DENSE_LAYERS)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_config_and_keras_file_round_trip(name, tmp_path):
    make, shape = LAYERS[name]
    layer = make()
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()

    inputs = keras.Input(shape[1:])
    model = keras.Model(inputs, layer(inputs))
    for v in model.weights:  # non-default values, so a lost weight shows
        v.assign(np.random.default_rng(7).normal(size=v.shape).astype("float32"))
    x = np.random.default_rng(8).normal(size=shape).astype("float32")
    path = tmp_path / "layer.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.layers[1]) is type(layer)
    np.testing.assert_array_equal(_np(loaded(x)), _np(model(x)))


def _composed_block(**kwargs):
    """A block given an eight-head attention and a ReLU MLP, with layer scale."""
    return L.TransformerBlock(
        attention=L.Attention(8), mlp=ReluMLP(24), layer_scale_init=0.5, **kwargs
    )


def _numpy_relu(h):
    return np.maximum(h, 0.0)


def test_block_computes_with_the_attention_and_mlp_it_is_given():
    x = np.random.default_rng(11).normal(size=(2, 7, 16)).astype("float32")
    block = _composed_block()
    block.build(x.shape)
    _randomised(block, seed=12)
    expected, expected_weights = _numpy_block(
        block, x.astype("float64"), heads=8, activation=_numpy_relu
    )
    out, weights = block(x, return_attention=True)
    assert weights.shape == (2, 8, 7, 7)
    np.testing.assert_allclose(_np(out), expected, atol=1e-4)
    np.testing.assert_allclose(_np(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(_np(block(x)), expected, atol=1e-4)


@pytest.mark.parametrize("rope", [False, True])
def test_block_of_given_sublayers_is_the_keyword_block_with_the_same_settings(rope):
    # Same variables, paths and order (what `.keras` files, optimizer states and the
    # weight converters address), and the same numbers; with rope, the table reaches
    # the given attention.
    x = np.random.default_rng(13).normal(size=(2, 7, 16)).astype("float32")
    keyword = L.TransformerBlock(
        2, 32, layer_scale_init=1e-6, mlp_norm=True, rope=rope, name="block"
    )
    composed = L.TransformerBlock(
        attention=L.Attention(2, rope=rope), mlp=L.MLP(32, norm_epsilon=1e-6),
        layer_scale_init=1e-6, name="block",
    )
    for block in (keyword, composed):
        block.build(x.shape)
    # (Their dropouts' seed states, also variables, are named by a global count.)
    assert [v.path for v in composed.weights] == [v.path for v in keyword.weights]
    assert len(composed.variables) == len(keyword.variables)
    _randomised(keyword, seed=14)
    _randomised(composed, seed=14)
    table = L.RotaryEmbedding(8, grid_size=(2, 3), num_prefix_tokens=1)(x[:, 1:]) if rope else None
    np.testing.assert_array_equal(_np(composed(x, rope=table)), _np(keyword(x, rope=table)))


def test_block_of_given_sublayers_round_trips_its_config_and_keras_file(tmp_path):
    x = np.random.default_rng(15).normal(size=(2, 7, 16)).astype("float32")
    block = _composed_block(dropout_rate=0.1, drop_path_rate=0.1)
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, block(inputs))
    _randomised(block, seed=16)
    expected, _ = _numpy_block(block, x.astype("float64"), heads=8, activation=_numpy_relu)
    config = block.get_config()
    assert config["mlp"]["registered_name"] == "keras_vit_tests>ReluMLP"
    assert config["attention"]["config"]["num_heads"] == 8
    assert not {"num_heads", "mlp_dim", "gelu_approximate"} & set(config)

    clone = L.TransformerBlock.from_config(config)
    assert clone.get_config() == config
    clone.build(x.shape)
    assert [v.path for v in clone.weights] == [v.path for v in block.weights]
    for source, target in zip(block.weights, clone.weights):
        target.assign(source)
    np.testing.assert_array_equal(_np(clone(x)), _np(block(x)))

    model.save(tmp_path / "composed.keras")
    loaded = keras.saving.load_model(tmp_path / "composed.keras")
    np.testing.assert_array_equal(_np(loaded(x)), _np(model(x)))
    np.testing.assert_allclose(_np(loaded(x)), expected, atol=1e-4)  # still ReLU, 8 heads


def test_int8_block_of_given_sublayers_round_trips_through_a_keras_file(tmp_path):
    # Its quantized Dense layers are rebuilt from its sublayers' own configs.
    x = np.random.default_rng(17).normal(size=(2, 7, 16)).astype("float32")
    block = L.TransformerBlock(mlp_dim=32, attention=L.Attention(4))
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, block(inputs))
    _randomised(block, seed=18)
    model.quantize("int8")
    model.save(tmp_path / "int8.keras")
    loaded = keras.saving.load_model(tmp_path / "int8.keras").layers[1]
    assert [dense.quantization_mode for dense in loaded.projections()] == ["int8"] * 4
    assert set(loaded.get_config()["dense_dtypes"]) == {"mlp_fc1", "mlp_fc2"}
    np.testing.assert_array_equal(_np(loaded(x)), _np(block(x)))


def test_block_rejects_sublayers_it_cannot_compose():
    with pytest.raises(ValueError, match="ready-made attention layer and num_heads, rope"):
        L.TransformerBlock(num_heads=4, mlp_dim=8, rope=True, attention=L.Attention(8))
    with pytest.raises(ValueError, match="ready-made mlp layer and mlp_dim, quick_gelu"):
        L.TransformerBlock(2, 8, quick_gelu=True, mlp=L.MLP(8))
    with pytest.raises(ValueError, match=r"mlp must be 'gelu', 'swiglu' or a .*MLP.*got Dense"):
        L.TransformerBlock(2, mlp=keras.layers.Dense(8))
    with pytest.raises(ValueError, match="attention must be a keras_vit.layers.Attention"):
        L.TransformerBlock(mlp_dim=8, attention=keras.layers.Dense(8))
    built = L.Attention(2)
    built.build((None, 5, 8))
    with pytest.raises(ValueError, match=f"attention '{built.name}' is already built"):
        L.TransformerBlock(mlp_dim=8, attention=built)
    with pytest.raises(ValueError, match="needs num_heads, or a ready-made attention"):
        L.TransformerBlock(mlp_dim=8)
    with pytest.raises(ValueError, match="needs mlp_dim, or a ready-made mlp"):
        L.TransformerBlock(2)


def test_patches_rejects_indivisible_size_and_wrong_channels():
    with pytest.raises(ValueError, match="height 30 is not divisible by patch_size 8"):
        L.Patches(8).build((None, 30, 32, 3))
    layer = L.Patches(8)
    layer.build((None, 32, 32, 3))
    with pytest.raises(ValueError, match="Expected images with 3 channels.*got 1 channels"):
        layer(np.zeros((1, 32, 32, 1), "float32"))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_transformer_block_symbolic_outputs_are_what_it_returns(policy):
    # The block states its outputs from the shapes (`compute_output_spec`) instead of
    # tracing `call`: they must be the shapes and dtypes that `call` returns.
    keras.config.set_dtype_policy(policy)
    block = L.TransformerBlock(num_heads=2, mlp_dim=16)
    symbolic = keras.KerasTensor((None, 5, 8))
    tokens = np.random.default_rng(0).normal(size=(3, 5, 8)).astype("float32")
    for return_attention in (False, True):
        specs = keras.tree.flatten(block(symbolic, return_attention=return_attention))
        values = keras.tree.flatten(block(tokens, return_attention=return_attention))
        assert [(s.shape, s.dtype) for s in specs] == [
            ((None, *v.shape[1:]), keras.backend.standardize_dtype(v.dtype)) for v in values
        ]
    assert specs[0].dtype == keras.config.dtype_policy().compute_dtype
    assert specs[1].shape == (None, 2, 5, 5) and specs[1].dtype == "float32"


def test_transformer_block_rejects_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="hidden_dim 30 is not divisible by num_heads 4"):
        L.TransformerBlock(4, 8).build((None, 5, 30))


def test_int8_model_round_trips_through_a_keras_file(tmp_path):
    # The Dense layers inside PatchEncoder and TransformerBlock are rebuilt from their
    # owner's config, which must say that they were quantized.
    from helpers import randomise_weights, tiny_vit

    model = tiny_vit()
    randomise_weights(model, seed=1)
    model.quantize("int8")
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "int8.keras")
    loaded = keras.saving.load_model(tmp_path / "int8.keras")
    for name in ("qkv", "attention_output", "mlp_fc1", "mlp_fc2"):
        assert getattr(loaded.get_layer("encoderblock_1"), name).quantization_mode == "int8"
    assert loaded.get_layer("patch_encoder").projection.quantization_mode == "int8"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(images)), keras.ops.convert_to_numpy(model(images))
    )


def test_block_runs_its_int8_projections_through_keras_quantized_call():
    # A quantized Dense has its own dtype policy ("int8_from_float32"), so the block calls
    # it through Keras (`quantized_call`) also on PyTorch, where it calls the sublayers that
    # share its policy directly: the int8 block's outputs are the float block's, rounded.
    block, x = _random_block(2, seed=9)
    reference = _np(block(x))
    for dense in block.projections():
        dense.quantize("int8")
    assert {dense.dtype_policy.name for dense in block.projections()} == {"int8_from_float32"}
    quantized = _np(block(x))
    assert not np.array_equal(quantized, reference)
    np.testing.assert_allclose(quantized, reference, rtol=0, atol=0.05 * np.abs(reference).max())
