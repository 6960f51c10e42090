"""Several JAX processes through `keras-vit pretrain`: the README's two-process command
trains as one process does, and processes that cannot start together say which."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

pytestmark = pytest.mark.slow  # several processes per test

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The README's two-process CPU snippet, run as written (its port made free, and the
# `keras-vit` command this checkout's).
(TWO_PROCESSES,) = [
    block for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    if "JAX_PROCESS_ID=1" in block
]
# The demo recipe, smaller: the processes' time is mostly start-up and compiling.
TINY = [
    "--recipe", "demo", "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "data.batch_size=32", "--set", "schedule.epochs=1",
    "--set", "schedule.micro_batches_per_epoch=4", "--set", "checkpointing.tensorboard=false",
]


def _free_port():
    # The coordinator uses PORT and PORT + 1: find two free ones in a row.
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue


def _env(**more):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    return dict(env, PYTHONPATH=str(ROOT), KERAS_BACKEND="jax", **more)


def _start(args, cwd):
    """Starts `args` in `cwd`, its output to files there (a full pipe would stall it)."""
    out, err = (open(os.path.join(cwd, name), "w+") for name in ("stdout.txt", "stderr.txt"))
    process = subprocess.Popen(args, cwd=cwd, env=_env(), stdout=out, stderr=err)
    process.output = out, err
    return process


def _cli(args, cwd):
    return _start([sys.executable, "-m", "keras_vit", "pretrain", *args], cwd)


def _process(cwd, port, index, count, *extra):
    """`keras-vit pretrain` (`TINY`) as process `index` of `count`, process 0 at 127.0.0.1:port."""
    return _cli(
        [*TINY, "--out", "run", "--set", f"distribution.coordinator=127.0.0.1:{port}",
         "--set", f"distribution.num_processes={count}", "--set", f"distribution.process_id={index}",
         *extra],
        cwd,
    )


def _finish(procs, timeout=600):
    """`(exit code, stdout, stderr)` of each of `procs`, killed if still running after
    `timeout` seconds (a hang fails the test, not the session)."""
    results = []
    try:
        for p in procs:
            p.wait(timeout=timeout)
            texts = []
            for file in p.output:
                file.seek(0)
                texts.append(file.read())
                file.close()
            results.append((p.returncode, *texts))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts everything at once (start-up and compiling dominate): the README's
    two-process run, the same command in one process, a second process with another
    batch size, and a process 0 whose process 1 never comes."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    other = [tmp_path_factory.mktemp("other") for _ in range(2)]
    lonely = tmp_path_factory.mktemp("lonely")
    port = _free_port()
    script = TWO_PROCESSES.replace("127.0.0.1:8476", f"127.0.0.1:{port}").replace(
        "keras-vit ", f"{sys.executable} -m keras_vit "
    )
    started = {
        "two": [_start(["bash", "-ec", script], two)],
        # The README's command without the JAX_ variables: one process.
        "one": [_cli(["--recipe", "demo", "--out", "runs/two", "--set", "schedule.epochs=2"], one)],
    }
    port = _free_port()
    started["other"] = [
        _process(other[0], port, 0, 2), _process(other[1], port, 1, 2, "--set", "data.batch_size=64")
    ]
    started["lonely"] = [_process(lonely, _free_port(), 0, 2, "--set", "distribution.join_timeout=5")]
    results = {name: _finish(procs) for name, procs in started.items()}
    return dict(results, folders=dict(one=one / "runs" / "two", two=two / "runs" / "two"))


def _weights(folder):
    from keras_vit.training import runs

    return runs.read_keras(str(folder / "model.keras")).get_weights()


def test_two_processes_train_as_one(runs):
    """The README's two CPU processes end with one process's weights (to float32
    reduction order), and the run folder holds what one process writes, once."""
    ((code, out, err),) = runs["two"]
    assert code == 0, err[-3000:]
    ((code_one, _, err_one),) = runs["one"]
    assert code_one == 0, err_one[-3000:]
    one, two = runs["folders"]["one"], runs["folders"]["two"]
    # Every weight agrees to ~1e-7 but the key projection's bias, whose gradient is zero
    # but for rounding (softmax ignores it): Adam scales that noise up to ~1e-5 steps.
    for a, b in zip(_weights(one), _weights(two), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert sorted(os.listdir(two)) == sorted(os.listdir(one))
    rows = (two / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 2  # header, then each of the 2 epochs once
    assert "2 processes" in (two / "metrics.json").read_text()
    assert "in 2 processes (this is process 1)" in err and "(this is process 0)" in err
    assert out.count("Evaluation:") == 2  # both processes finished (only 0 wrote)


def test_process_with_other_settings_is_named(runs):
    """Process 1 with another batch size: both stop with one line naming it and the key."""
    for code, _, err in runs["other"]:
        assert code == 2, err[-3000:]
        (line,) = err.strip().splitlines()[-1:]
        assert "process 1: data.batch_size" in line, err[-3000:]


def test_process_that_never_joins_is_named(runs):
    """Process 0 waits `join_timeout` for a process 1 that never starts, then says so."""
    ((code, _, err),) = runs["lonely"]
    assert code == 2, err[-3000:]
    assert "process 1 of 2 did not join within 5 s" in err.strip().splitlines()[-1], err[-3000:]
