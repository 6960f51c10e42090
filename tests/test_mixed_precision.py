"""Mixed precision: what must run in float32 does, so 16-bit models stay finite and close
to their float32 twins (attention logits and softmax, LayerNorm statistics, the head),
and training under mixed_float16 scales its loss.

The model and layer tests run on every backend (tests/test_backends_*.py); the training
test uses the TensorFlow engine.
"""

import math

import keras
import numpy as np
import pytest

import keras_vit

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
# Unit roundoff (half the spacing at 1) of the 16-bit formats.
UNIT_ROUNDOFF = {"mixed_float16": 2.0**-11, "mixed_bfloat16": 2.0**-8}

# One block, 2 heads of 8: the block's tokens (class token + 4 patches) are few enough
# to read its logits in numpy.
TINY = dict(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2,
            mlp_dim=32, include_top=False, pooling=False)
HEAD_DIM = 8
# Every query and key gets the same component `OFFSET` along its first dimension, so
# every logit holds OFFSET**2 / sqrt(HEAD_DIM) = 70958 > 65504 on top of its own O(1)
# part: float16 overflows, bfloat16 (spacing 512 there) rounds the O(1) parts away, and
# the softmax, which the common part does not change, is not one-hot.
OFFSET = 448.0


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _overflowing_model(policy=None):
    """A `TINY` ViT whose logits in its block overflow float16 (weights from seed 0)."""
    model = keras_vit.ViT(**TINY, dtype=policy)
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign(rng.normal(scale=0.5, size=v.shape).astype("float32"))
    block = model.parts.blocks[0]
    block.norm1.gamma.assign(np.ones(16, "float32"))
    block.norm1.beta.assign(np.zeros(16, "float32"))
    kernel, bias = _np(block.qkv.kernel), _np(block.qkv.bias)
    # Columns q | k | v, heads contiguous in each: the first column of each head of q and k.
    first = [part * 16 + head * HEAD_DIM for part in (0, 1) for head in (0, 1)]
    kernel[:, :32] *= 0.5  # O(1) logits besides the common part
    kernel[:, first] = 0.0
    bias[first] = OFFSET
    block.qkv.kernel.assign(kernel)
    block.qkv.bias.assign(bias)
    return model


def _block_inputs(model, images):
    """The tokens the first block receives."""
    return keras.Model(model.input, model.parts.dropout.output)(images)


def _reference_logits(model, tokens):
    """The first block's scaled attention logits, in float64 from its float32 weights."""
    block = model.parts.blocks[0]
    normed = _np(block.norm1(tokens)).astype("float64")
    qkv = normed @ _np(block.qkv.kernel).astype("float64") + _np(block.qkv.bias)
    qkv = qkv.reshape(*qkv.shape[:2], 3, 2, HEAD_DIM)
    q, k = qkv[:, :, 0].transpose(0, 2, 1, 3), qkv[:, :, 1].transpose(0, 2, 1, 3)
    return q @ k.transpose(0, 1, 3, 2) / math.sqrt(HEAD_DIM)


# Both models compute with float32 logits; they differ by the 16-bit rounding of the
# activations (unit roundoff u) through a LayerNorm, two Dense layers, the attention and
# the MLP, and by float32's rounding of the logits (sums of products of 2e5, spacing
# 2**-6 there: about 3e-3 of each scaled logit, in both). 16 u bounds the resulting error
# of the outputs relative to their largest (measured 1-5 u on the three backends): 8e-3
# for float16, 6e-2 for bfloat16. With logits made in 16 bits, float16 gives NaN and
# bfloat16 an error of a third of the outputs' size.
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_attention_logits_beyond_float16_stay_finite_and_close(policy):
    reference = _overflowing_model()
    mixed = _overflowing_model(policy)
    images = np.random.default_rng(1).uniform(-1, 1, size=(2, 8, 8, 3)).astype("float32")
    tokens = _block_inputs(reference, images)
    logits = _reference_logits(reference, tokens)
    assert logits.min() > FLOAT16_MAX  # the test can fail
    # Not one-hot: no row gives more than 85% of its weight to a single key.
    assert 1.0 / np.exp(logits - logits.max(axis=-1, keepdims=True)).sum(-1).min() < 0.85
    tolerance = 16 * UNIT_ROUNDOFF[policy]
    expected = _np(reference(images))
    scale = np.abs(expected).max()
    got = _np(mixed(images)).astype("float32")  # the fused path where the backend has one
    assert np.isfinite(got).all()
    assert np.abs(got - expected).max() < tolerance * scale
    # The explicit path, which also returns the attention weights.
    expected, expected_weights = reference.parts.blocks[0](tokens, return_attention=True)
    got, weights = mixed.parts.blocks[0](tokens, return_attention=True)
    got, expected = _np(got).astype("float32"), _np(expected)
    assert np.isfinite(got).all()
    assert np.abs(got - expected).max() < tolerance * np.abs(expected).max()
    np.testing.assert_allclose(
        _np(weights).astype("float32"), _np(expected_weights), atol=tolerance
    )


@pytest.mark.skipif(
    keras.backend.backend() == "tensorflow", reason="TransformerBlock uses no fused kernel there"
)
def test_fused_attention_of_float16_beyond_its_range():
    """The kernel `ops.dot_product_attention` runs (PyTorch's SDPA; on JAX, its XLA
    attention, what cuDNN falls back to) keeps float16 logits beyond 65504 finite."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 5, 2, HEAD_DIM)) for _ in range(3))
    q[..., 0] = k[..., 0] = OFFSET  # common part 70958, as in the model above
    q, k, v = (x.astype("float16") for x in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q.astype("float64"), k.astype("float64"))
    logits /= math.sqrt(HEAD_DIM)
    assert logits.min() > FLOAT16_MAX
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected = np.einsum("bnts,bsnh->btnh", weights / weights.sum(-1, keepdims=True), v)
    got = _np(keras.ops.dot_product_attention(q, k, v)).astype("float64")
    assert np.isfinite(got).all()
    # Float32 sums of products of 2e5 round to within 2**-7 (its spacing there is 2**-6),
    # 3e-3 of each scaled logit and so of each weight, about 6 float16 unit roundoffs
    # (measured 5.4); 16 of them bound the error relative to the largest output. Float16
    # logits would be infinite.
    tolerance = 16 * UNIT_ROUNDOFF["mixed_float16"]
    assert np.abs(got - expected).max() < tolerance * np.abs(expected).max()


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


# Activations with a mean of 5000 and a spread of 100: in float16 their sum over 16
# features (8e4) and their squares (2.5e7) overflow, in bfloat16 (spacing 32 at 5000)
# sums lose the spread, so only float32 statistics keep it. The result is rounded to
# the 16-bit format once: 4 u of the largest output bounds the error.
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_layer_norm_statistics_are_float32(policy):
    compute_dtype = policy.replace("mixed_", "")
    model = keras_vit.ViT(**TINY, dtype=policy)
    rng = np.random.default_rng(2)
    for layer in (model.parts.blocks[0].norm1, model.parts.blocks[0].norm2, model.parts.norm):
        layer.gamma.assign(rng.normal(1.0, 0.5, size=16).astype("float32"))
        layer.beta.assign(rng.normal(0.0, 0.5, size=16).astype("float32"))
        x = keras.ops.cast(rng.normal(5000.0, 100.0, size=(3, 5, 16)), compute_dtype)
        expected = _layer_norm(
            _np(keras.ops.cast(x, "float32")).astype("float64"),
            _np(layer.gamma), _np(layer.beta), layer.epsilon,
        )
        got = layer(x)
        assert keras.backend.standardize_dtype(got.dtype) == compute_dtype
        got = _np(keras.ops.cast(got, "float32"))
        assert np.abs(got - expected).max() < 4 * UNIT_ROUNDOFF[policy] * np.abs(expected).max()


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the training engine is TensorFlow's"
)
@pytest.mark.parametrize("objective", ["supervised", "mpp"])
def test_mixed_float16_training_scales_the_loss_and_stays_finite(tmp_path, objective):
    from helpers import tiny_run

    from keras_vit.training.engine import TrainConfig, train

    seen = {}

    class Watch(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["initial"] = self.model.get_weights()

        def on_train_end(self, logs=None):
            seen["final"] = self.model.get_weights()

        def on_train_batch_end(self, batch, logs=None):
            seen.setdefault("losses", []).append(logs["loss"])
            seen["optimizer"] = self.model.optimizer
            seen["scale"] = float(_np(self.model.optimizer.scale_loss(1.0)))
            seen["compute_dtype"] = self.model.compute_dtype

    config = TrainConfig(
        **tiny_run(
            optimization=dict(objective=objective),
            schedule=dict(epochs=1, micro_batches_per_epoch=4),
            distribution=dict(precision="mixed_float16", jit_compile="off"),
        ),
        out=str(tmp_path),
    )
    result = train(config, callbacks=[Watch()], verbose=0)
    assert seen["compute_dtype"] == "float16"
    assert isinstance(seen["optimizer"], keras.optimizers.LossScaleOptimizer)
    # The loss is multiplied by Keras' dynamic scale: 2**15 at first, halved on each
    # non-finite gradient (whose update is skipped).
    assert seen["scale"] in [2.0**e for e in range(1, 16)]
    assert len(seen["losses"]) == 4 and np.isfinite(seen["losses"]).all()
    assert all(np.isfinite(w).all() for w in result.model.get_weights())
    assert any(not np.array_equal(a, b) for a, b in zip(seen["final"], seen["initial"]))
    if objective == "supervised":
        assert result.model.parts.head.compute_dtype == "float32"


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory):
    """16 real photos: crops of scikit-learn's two sample photos (640x427), as PNGs."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    folder = tmp_path_factory.mktemp("photos")
    paths = []
    for i, photo in enumerate(load_sample_images().images):
        for j in range(8):
            left, top = 60 * j, 25 * j
            path = str(folder / f"{i}_{j}.png")
            Image.fromarray(photo[top:top + 240, left:left + 160]).save(path)
            paths.append(path)
    return paths


def _classifier(seed=0):
    from helpers import randomise_weights, tiny_vit

    model = tiny_vit()
    randomise_weights(model, seed=seed)
    return model


def test_bfloat16_classify_is_float32s_within_bfloat16_rounding(photo_files):
    """`classify(..., precision="bfloat16")` runs a `mixed_bfloat16` copy of the float32
    model (`with_precision`): its logits are the float32 model's within bfloat16's
    rounding (16 u of the largest, as above; measured 0.9-1.4 u on the three backends;
    not equal, so it did compute in bfloat16),
    and the classes it ranks first on real photos are the float32 model's."""
    from keras_vit.inference import with_precision

    model = _classifier()
    inputs = keras_vit.data.read_images(photo_files, 32)
    expected = _np(model.predict_on_batch(inputs))
    copy = with_precision(model, "bfloat16")
    assert copy.dtype_policy.name == "mixed_bfloat16" and model.dtype_policy.name == "float32"
    got = _np(copy.predict_on_batch(inputs))
    assert got.dtype == np.float32  # the head's logits stay float32
    error = np.abs(got - expected).max()
    assert 0 < error < 16 * UNIT_ROUNDOFF["mixed_bfloat16"] * np.abs(expected).max()
    single = keras_vit.classify(model, photo_files, top_k=1)
    half = keras_vit.classify(model, photo_files, top_k=1, precision="bfloat16")
    assert [r["top_k"][0]["class"] for r in half] == [r["top_k"][0]["class"] for r in single]
    assert [r["top_k"][0]["class"] for r in single] == list(expected.argmax(-1))


def test_the_bfloat16_copy_follows_the_models_weights(photo_files):
    """The copy is made once per model and precision, compiled as the model was
    (`jit_compile`), its weights copied on each call: after the model's weights change,
    bfloat16 classifies as the new float32 model."""
    from keras_vit.inference import with_precision

    model, other = _classifier(seed=0), _classifier(seed=1)
    for each in (model, other):
        each.compile(jit_compile=False)  # XLA is the default on TensorFlow and JAX
    copy = with_precision(model, "bfloat16")
    assert copy.compiled and copy.jit_compile is False
    model.set_weights(other.get_weights())
    assert with_precision(model, "bfloat16") is copy
    for mine, theirs in zip(copy.weights, other.weights):
        np.testing.assert_array_equal(_np(mine), _np(theirs))
    assert keras_vit.classify(model, photo_files[:4], precision="bfloat16") == keras_vit.classify(
        other, photo_files[:4], precision="bfloat16")


def test_classify_refuses_an_unknown_precision_naming_it(photo_files):
    model = _classifier()
    with pytest.raises(ValueError, match="Unknown precision 'half': expected one of "
                                         "'float32', 'bfloat16', 'auto'."):
        keras_vit.classify(model, photo_files[:1], precision="half")
    model.quantize("int8")
    with pytest.raises(ValueError, match="precision='bfloat16' for a quantized model"):
        keras_vit.classify(model, photo_files[:1], precision="bfloat16")
