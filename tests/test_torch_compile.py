"""`compile(jit_compile=True)` on PyTorch: Keras runs the steps through `torch.compile`.

The paper's ViT (float32) and DINOv3 (`mixed_bfloat16`), tiny, with `dynamic_image_size`
(DINOv3: by its own switches), and DeiT, DINOv2, SigLIP, CLIP and EVA-02 (float32): the
compiled predict step gives the eager model's outputs (the same weights, within float32
rounding; within bfloat16 rounding of the outputs under the mixed policy), Dynamo traces it without a graph break, and a later step at a size it has seen
compiles nothing; a compiled training step updates the weights as an eager one does.

PyTorch only (the module is skipped elsewhere): tests/test_backends_torch.py runs it under
KERAS_BACKEND=torch. Each test compiles with Inductor, tens of seconds on a CPU.
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.families import dinov3
from family_contract import TINY, randomised, relative_error

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "torch", reason="torch.compile is the PyTorch backend's"
    ),
    pytest.mark.slow,  # Inductor compiles each model's step
    pytest.mark.every_backend,
]

# Architecture switches on the tiny model (tests/family_contract.py's TINY).
FAMILIES = {
    "vit": {},
    # DINOv3's own switches: its rope, registers, layer scale, any image size.
    "dinov3": {k: v for k, v in dinov3.SWITCHES.items() if k != "include_top"},
    # The other families' layers (as in their test modules' family contracts): DeiT's
    # distillation token and head; DINOv2's registers, SwiGLU, layer scale and bicubic
    # resampling at any size; SigLIP's MAP head; CLIP's pre-norm and quick GELU; EVA-02's
    # axial rope, SwiGLU with its norm and pooled head.
    "deit": dict(distilled=True, no_embed_class=True, layer_scale_init=0.1),
    "dinov2": dict(num_registers=2, mlp="swiglu", layer_scale_init=0.1, no_embed_class=True,
                   dynamic_image_size=True, pos_interpolation="bicubic"),
    "siglip": dict(classifier="map", gelu_approximate=True),
    "clip": dict(pre_norm=True, quick_gelu=True, patch_bias=False, layer_norm_epsilon=1e-5),
    "eva02": dict(mlp="swiglu", rope=True, rope_reference_grid=(3, 2), classifier="avg",
                  fc_norm=True, mlp_norm=True),
}
# (family, policy, dynamic_image_size): the paper's ViT with the in-graph position
# resampling, DINOv3 with its rotary tables, registers and layer scale under the mixed
# policy, then every other family at its own sizes (each case compiles for seconds to tens
# of seconds).
CASES = [
    ("vit", "float32", True), ("dinov3", "mixed_bfloat16", True),
    *((family, "float32", False) for family in ("deit", "dinov2", "siglip", "clip", "eva02")),
]
# Image sizes of a dynamic model's batches: the trained one, two others, then each again.
DYNAMIC_SIZES = [(32, 32), (48, 40), (40, 56)]
# Relative error of outputs that differ only by rounding: float32's, or one bfloat16
# rounding of the result (2^-8) with room for a few along the way.
TOLERANCE = {"float32": 1e-5, "mixed_bfloat16": 2**-6}


def dynamo_counts():
    """Dynamo's graph breaks (reason: count) and the graphs it has compiled so far."""
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"]), counters["stats"]["unique_graphs"]


def reset_dynamo():
    """Dynamo's caches and counters emptied: the counts are this test's alone, not those
    of the tests before it in the process (`tests/test_backends_torch.py` runs them in one)."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def twins(switches, policy):
    """An eager model of `switches` (one block) with random weights, and its
    `jit_compile=True` twin holding the same weights."""
    # Dynamo traces every block, so the graphs to compile grow with the depth; a second
    # block would run the first one's code again.
    switches = dict(switches, num_layers=1)
    keras.config.set_dtype_policy(policy)
    try:
        eager = randomised(**switches)
        compiled = keras_vit.ViT(**{**TINY, **switches})
    finally:
        keras.config.set_dtype_policy("float32")
    compiled.set_weights(eager.get_weights())
    return eager, compiled


def images(size, seed):
    return keras.ops.convert_to_tensor(
        np.random.default_rng(seed).uniform(-1, 1, (2, *size, 3)).astype("float32")
    )


@pytest.mark.parametrize("family,policy,dynamic", CASES)
def test_compiled_predict_is_eager_predict_in_one_graph(family, policy, dynamic):
    reset_dynamo()
    switches = dict(FAMILIES[family], **({"dynamic_image_size": True} if dynamic else {}))
    eager, compiled = twins(switches, policy)
    eager.compile(jit_compile=False)
    compiled.compile(jit_compile=True)
    sizes = DYNAMIC_SIZES if switches.get("dynamic_image_size") else [(32, 32)]
    batches = [images(size, seed) for seed, size in enumerate(sizes)]
    for x in batches:
        ours, reference = (
            keras.ops.convert_to_numpy(keras.ops.cast(m.predict_on_batch(x), "float32"))
            for m in (compiled, eager)
        )
        assert relative_error([ours], [reference]) < TOLERANCE[policy], x.shape
    breaks, graphs = dynamo_counts()
    assert not breaks
    for x in batches:  # sizes seen before: no new graph
        compiled.predict_on_batch(x)
    assert dynamo_counts() == (breaks, graphs)


@pytest.mark.parametrize("family,policy", [("vit", "float32")])
def test_compiled_train_step_updates_weights_as_eager_one(family, policy):
    reset_dynamo()
    eager, compiled = twins(FAMILIES[family], policy)
    before = eager.get_weights()
    for model, jit in ((eager, False), (compiled, True)):
        # SGD's update is proportional to the gradient (Adam's is about its learning rate
        # whatever the gradient's size), so the updates compare the gradients.
        model.compile(
            optimizer=keras.optimizers.SGD(
                0.1, momentum=0.9, weight_decay=0.01, global_clipnorm=1.0
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
    x, y = images((32, 32), 0), keras.ops.convert_to_tensor(np.array([1, 7]))
    # Two steps: the first finds the gradients unset and the optimizer's slots new.
    for _ in range(2):
        losses = [model.train_on_batch(x, y) for model in (compiled, eager)]
        assert abs(losses[0] - losses[1]) < TOLERANCE[policy] * abs(losses[1])
    for ours, reference, start in zip(compiled.get_weights(), eager.get_weights(), before):
        # Within rounding of the update, and of the float32 weight it was added to (an
        # update is a small part of its weight).
        update = np.abs(reference - start).max()
        rounding = 4 * np.spacing(np.abs(reference).max())
        assert np.abs(ours - reference).max() <= TOLERANCE[policy] * update + rounding
    breaks, graphs = dynamo_counts()
    compiled.train_on_batch(x, y)
    assert dynamo_counts() == (breaks, graphs)
