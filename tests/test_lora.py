"""LoRA fine-tuning: what trains, what stays bit-identical, what a saved model holds."""

import logging

import keras
import numpy as np
import pytest

from helpers import randomise_weights, tiny_vit
from keras_vit.training.lora import TARGETS, enable_lora
from keras_vit.utils.keras_compat import sublayers


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _fit_a_little(model, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.uniform(-1, 1, (16, 32, 32, 3)).astype("float32")
    labels = keras.utils.to_categorical(rng.integers(0, 10, 16), 10)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="categorical_crossentropy")
    model.fit(images, labels, epochs=2, batch_size=8, verbose=0)
    return images


def test_only_factors_and_head_train_and_the_base_stays_bit_identical():
    model = tiny_vit()
    randomise_weights(model, seed=1)
    before = {v.path: _np(v).copy() for v in model.weights}
    counts = enable_lora(model, 4)
    trainable = {v.path for v in model.trainable_weights}
    factors = {f"encoderblock_{i}/{name}/lora_kernel_{ab}"
               for i in range(2) for name in TARGETS for ab in "ab"}
    assert trainable == factors | {"head/kernel", "head/bias"}
    # Factors: rank x (in + out) per layer; width 32, 3*32 for qkv, mlp 64.
    per_block = 4 * ((32 + 96) + (32 + 32) + (32 + 64) + (64 + 32))
    assert counts == {"trainable": 2 * per_block + 32 * 10 + 10,
                      "total": model.count_params(), "layers": 8}
    assert counts["total"] == sum(before[p].size for p in before) + 2 * per_block

    images = _fit_a_little(model)
    for v in model.weights:
        if v.path in before and not v.path.startswith("head/"):
            np.testing.assert_array_equal(_np(v), before[v.path], err_msg=v.path)
    assert not np.array_equal(_np(model.get_layer("head").kernel), before["head/kernel"])
    qkv = model.get_layer("encoderblock_0").qkv
    assert np.abs(_np(qkv.lora_kernel_b)).max() > 0  # B starts at zero and has moved
    assert not np.allclose(_np(model(images)), 0)


def test_train_norms_adds_the_layer_norms():
    model = tiny_vit()
    enable_lora(model, 2, train_norms=True)
    norms = {v.path for v in model.trainable_weights if "norm" in v.path}
    assert norms == {f"encoderblock_{i}/norm{j}/{w}" for i in range(2) for j in (1, 2)
                     for w in ("gamma", "beta")} | {"encoder_norm/gamma", "encoder_norm/beta"}


def test_saved_model_holds_the_merged_kernels_in_the_plain_architecture(tmp_path):
    model = tiny_vit()
    randomise_weights(model, seed=1)
    enable_lora(model, 4)
    images = _fit_a_little(model)
    block = model.get_layer("encoderblock_1")
    scale = block.mlp_fc1.lora_alpha / block.mlp_fc1.lora_rank
    merged = _np(block.mlp_fc1._kernel) + scale * (
        _np(block.mlp_fc1.lora_kernel_a) @ _np(block.mlp_fc1.lora_kernel_b)
    )
    path = tmp_path / "lora.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    loaded_fc1 = loaded.get_layer("encoderblock_1").mlp_fc1
    assert not loaded_fc1.lora_enabled
    assert loaded.count_params() == tiny_vit().count_params()
    np.testing.assert_allclose(_np(loaded_fc1.kernel), merged, atol=1e-6)
    np.testing.assert_allclose(_np(loaded(images)), _np(model(images)), atol=1e-5)


@pytest.mark.parametrize("rank, message", [
    (0, "LoRA rank must be a positive integer, got 0"),
    (2.5, "got 2.5"),
    (32, "LoRA rank 32 is not below the width of the kernels \\(32\\)"),
])
def test_bad_ranks_are_named(rank, message):
    with pytest.raises(ValueError, match=message):
        enable_lora(tiny_vit(), rank)


def test_lora_twice_is_refused():
    model = tiny_vit()
    enable_lora(model, 2)
    with pytest.raises(ValueError, match="already has LoRA factors"):
        enable_lora(model, 2)


@pytest.mark.slow
def test_engine_lora_run_reports_counts_and_keeps_the_base(tmp_path, caplog):
    from keras_vit import cli
    from keras_vit.training import runs
    from keras_vit.training.config import apply_overrides
    from keras_vit.training.engine import train

    base = tmp_path / "base"
    assert cli.main(["pretrain", "--recipe", "demo", "--out", str(base),
                     "--set", "schedule.epochs=2", "--set", "checkpointing.tensorboard=False",
                     "--set", "data.classes=0-4", "--set", "schedule.warmup_updates=5"]) == 0
    pretrained = runs.load_model(str(base))
    config = apply_overrides(cli.load_recipe("demo"), [
        f"model.init_from={base}", "model.lora_rank=4", "data.classes=5-9",
        "schedule.epochs=3", "schedule.warmup_updates=5", "checkpointing.tensorboard=False",
        f"out={tmp_path / 'lora'}",
    ])
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        result = train(config, verbose=0)
    assert "LoRA rank 4 on 8 Dense layers" in caplog.text
    for name in ("encoderblock_0", "encoderblock_1"):
        for dense in TARGETS:
            trained = getattr(result.model.get_layer(name), dense)
            np.testing.assert_array_equal(
                _np(trained._kernel), _np(getattr(pretrained.get_layer(name), dense).kernel)
            )
    np.testing.assert_array_equal(
        _np(result.model.get_layer("patch_encoder").position),
        _np(pretrained.get_layer("patch_encoder").position),
    )
    served = runs.load_model(str(tmp_path / "lora"))
    assert not any(getattr(layer, "lora_enabled", False) for layer in sublayers(served))
    assert result.metrics["top1"] > 0.4  # twice chance on five classes: it learned


@pytest.mark.slow
def test_lora_run_killed_mid_epoch_resumes_to_the_same_weights(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    from helpers import RESUMABLE, ROOT, TINY_RUN

    from keras_vit.training import runs

    config = json.dumps(dict(
        TINY_RUN,
        model=dict(TINY_RUN["model"], lora_rank=2),
        schedule=dict(TINY_RUN["schedule"], epochs=2, micro_batches_per_epoch=6),
        checkpointing=dict(TINY_RUN["checkpointing"], backup_every_micro_batches=2),
        distribution=dict(TINY_RUN["distribution"], deterministic=True),
    ))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}

    def start(out, *kill):
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(RESUMABLE), config,
                                 str(out), *kill], env=env, stderr=subprocess.PIPE, text=True)

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    first, second = start(straight), start(killed, "1:5")  # killed after step 5 of epoch 2
    assert first.wait(timeout=900) == 0, first.stderr.read()[-3000:]
    assert second.wait(timeout=900) == -signal.SIGKILL, second.stderr.read()[-3000:]
    resumed = start(killed)
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()[-3000:]
    expected = keras.saving.load_model(straight / runs.MODEL).get_weights()
    got = keras.saving.load_model(killed / runs.MODEL).get_weights()
    assert len(got) == len(expected)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
