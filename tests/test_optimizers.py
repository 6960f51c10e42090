"""keras-vit's Adam updates as Keras' own `keras.optimizers.Adam`, on every backend (on
PyTorch through one fused kernel), and saves and loads as a Keras optimizer."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.training.optimizers import Adam, make_optimizer

SHAPES = [(8, 12), (12,), (3, 3, 2, 4)]


def _gradients(rng, steps):
    """Gradients of three scales per step, a tenth of them zero: the smallest (1e-7)
    are of the order of Adam's epsilon, where epsilon is added decides the step."""
    scales = (1e-2, 1e-4, 1e-7)
    return [
        [(rng.normal(0, scale, shape) * (rng.uniform(size=shape) > 0.1)).astype("float32")
         for shape, scale in zip(SHAPES, scales)]
        for _ in range(steps)
    ]


def _run(optimizer, initial, gradient_steps, excluded=()):
    variables = [keras.Variable(w, name=f"w{i}") for i, w in enumerate(initial)]
    optimizer.exclude_from_weight_decay(var_list=[variables[i] for i in excluded])
    for grads in gradient_steps:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


def _schedule():
    return keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=2, decay_rate=0.5)


def _keras_rule_in_float64(initial, gradient_steps, amsgrad, beta_1=0.9, beta_2=0.999,
                           epsilon=1e-7):
    """Keras' Adam (`keras.optimizers.Adam.update_step`: epsilon added to the root of the
    uncorrected second moment) written out in float64, with `_schedule`'s rates."""
    weights = [w.astype("float64") for w in initial]
    m, v, v_max = ([np.zeros_like(w) for w in weights] for _ in range(3))
    for t, grads in enumerate(gradient_steps):
        rate = 1e-2 * 0.5 ** (t / 2)
        alpha = rate * np.sqrt(1 - beta_2 ** (t + 1)) / (1 - beta_1 ** (t + 1))
        for i, g in enumerate(grads):
            m[i] += (g - m[i]) * (1 - beta_1)
            v[i] += (np.square(g.astype("float64")) - v[i]) * (1 - beta_2)
            v_max[i] = np.maximum(v_max[i], v[i])
            weights[i] -= m[i] * alpha / (np.sqrt(v_max[i] if amsgrad else v[i]) + epsilon)
    return weights


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_is_keras_rule(amsgrad):
    rng = np.random.default_rng(0)
    initial = [rng.normal(0, 0.1, shape).astype("float32") for shape in SHAPES]
    gradient_steps = _gradients(rng, 6)
    ours = _run(Adam(_schedule(), amsgrad=amsgrad), initial, gradient_steps)
    expected = _keras_rule_in_float64(initial, gradient_steps, amsgrad)
    for a, b, w in zip(ours, expected, initial):
        assert np.abs(b - w).max() > 1e-3  # every variable moved
        # Keras' own update (ours on TensorFlow and JAX) is 2.2e-7 from the float64 rule
        # here: it takes the bias corrections' powers in float32.
        np.testing.assert_allclose(a, b, rtol=0, atol=3e-7)


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(amsgrad=True),
        dict(weight_decay=0.1, global_clipnorm=1e-3),
        dict(gradient_accumulation_steps=2, beta_1=0.8, beta_2=0.99, epsilon=1e-6),
    ],
    ids=["plain", "amsgrad", "decay-and-clip", "accumulation"],
)
def test_adam_updates_as_keras_adam(options):
    rng = np.random.default_rng(0)
    initial = [rng.normal(0, 0.1, shape).astype("float32") for shape in SHAPES]
    gradient_steps = _gradients(rng, 6)
    ours = _run(Adam(_schedule(), **options), initial, gradient_steps, excluded=[1])
    keras_own = _run(keras.optimizers.Adam(_schedule(), **options), initial, gradient_steps,
                     excluded=[1])
    for a, b, w in zip(ours, keras_own, initial):
        assert np.abs(b - w).max() > 1e-5  # every variable moved
        # Steps of 1e-2 to weights of 0.1-0.3; Keras' float32 bias corrections (above).
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-7)


@pytest.mark.parametrize("bound", [1e-3, 10.0])
def test_global_norm_clip_on_torch_is_the_closed_form(bound):
    """`global_clipnorm`'s clip as PyTorch's foreach kernels compute it: every gradient
    times bound / max(norm, bound), norm over all of them (float16 ones too), None kept."""
    if keras.backend.backend() != "torch":
        pytest.skip("the foreach clip is PyTorch's; elsewhere Adam clips as Keras does")
    import torch

    from keras_vit.backend.optimizer import clip_by_global_norm

    rng = np.random.default_rng(3)
    grads = [rng.normal(0, 0.1, shape).astype("float32") for shape in SHAPES]
    grads[2] = grads[2].astype("float16")
    norm = np.sqrt(sum(np.sum(np.square(g.astype("float64"))) for g in grads))
    clipped = clip_by_global_norm([torch.from_numpy(grads[0]), None,
                                   *(torch.from_numpy(g) for g in grads[1:])], bound)
    assert clipped[1] is None
    for got, g in zip(clipped[:1] + clipped[2:], grads):
        assert got.dtype == torch.from_numpy(g).dtype
        expected = g.astype("float64") * bound / max(norm, bound)
        # float16: a 10-bit mantissa, and a spacing of 6e-8 below 6e-5 (subnormals).
        rtol, atol = (1e-3, 6e-8) if g.dtype == np.float16 else (1e-6, 0)
        np.testing.assert_allclose(got.float().numpy(), expected, rtol=rtol, atol=atol)
    infinite = clip_by_global_norm([torch.tensor([np.inf, 1.0])], bound)
    assert torch.isnan(infinite[0]).all()  # as Keras: a non-finite norm gives NaN


def test_make_optimizer_builds_it_and_fit_takes_the_same_step():
    def model():
        keras.utils.set_random_seed(0)
        return keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                             num_heads=2, mlp_dim=32, num_classes=3,
                             head_bias_init=0.1)

    rng = np.random.default_rng(1)
    images = rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    labels = rng.integers(0, 3, 4)
    weights = []
    for ours in (True, False):
        m = model()
        optimizer = make_optimizer("adamw", 1e-2, m, weight_decay=0.1, clip_norm=1.0)
        assert type(optimizer) is Adam
        if not ours:
            optimizer = keras.optimizers.Adam.from_config(optimizer.get_config())
            optimizer.exclude_from_weight_decay(var_list=[
                v for v in m.trainable_variables
                if id(v) not in {id(k) for k in m.kernels()}
            ])
        m.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(True))
        m.fit(images, labels, batch_size=4, epochs=1, shuffle=False, verbose=0)
        weights.append(m.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


def test_a_saved_model_loads_it_with_its_moments(tmp_path):
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                          num_heads=2, mlp_dim=32, num_classes=3)
    model.compile(optimizer=Adam(1e-3, amsgrad=True),
                  loss=keras.losses.SparseCategoricalCrossentropy(True))
    rng = np.random.default_rng(2)
    model.fit(rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32"), rng.integers(0, 3, 4),
              epochs=2, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is Adam
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    saved = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    restored = [keras.ops.convert_to_numpy(v) for v in loaded.optimizer.variables]
    assert len(saved) == len(restored) and int(saved[0]) == 2
    for a, b in zip(saved, restored):
        np.testing.assert_array_equal(a, b)


def test_under_torch_compile_it_traces_whole_as_keras_step():
    """With `jit_compile=True` on PyTorch the step is traced whole: under `torch.compile`
    Adam leaves its step to Keras' own (which the compiler fuses), without a graph break
    (`fullgraph=True` raises at one), and moves the weights as Keras' Adam does."""
    if keras.backend.backend() != "torch":
        pytest.skip("torch.compile is PyTorch's")
    import torch

    rng = np.random.default_rng(4)
    initial = [rng.normal(0, 0.1, shape).astype("float32") for shape in SHAPES]
    gradient_steps = _gradients(rng, 2)
    results = []
    for cls, compiled in ((Adam, True), (keras.optimizers.Adam, False)):
        variables = [keras.Variable(w) for w in initial]
        optimizer = cls(1e-2, weight_decay=0.1, global_clipnorm=1e-3)
        optimizer.build(variables)

        def apply(grads, optimizer=optimizer, variables=variables):
            optimizer.apply(grads, variables)

        if compiled:
            apply = torch.compile(apply, backend="eager", fullgraph=True)
        for grads in gradient_steps:
            apply([torch.from_numpy(g) for g in grads])
        results.append([keras.ops.convert_to_numpy(v) for v in variables])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-7)
