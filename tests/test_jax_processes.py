"""Several JAX processes through `keras-vit pretrain`: the docs' two-process command
(docs/distributed.md)
trains as one process does, killed and restarted it resumes exactly, and processes that
cannot start together say which."""

import os
import re
import socket
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

pytestmark = pytest.mark.slow  # several processes per test

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "docs" / "distributed.md").read_text()
# The docs' two-process CPU snippet, run as written (its port made free, and the
# `keras-vit` command this checkout's).
(TWO_PROCESSES,) = [
    block for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    if "JAX_PROCESS_ID=1" in block
]
# Its command's arguments.
README_ARGS = ["--recipe", "demo", "--out", "runs/two", "--set", "schedule.epochs=2"]
assert f"keras-vit pretrain {' '.join(README_ARGS)}" in TWO_PROCESSES
# The demo recipe, smaller: the processes' time is mostly start-up and compiling.
TINY = [
    "--recipe", "demo", "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "data.batch_size=32", "--set", "schedule.epochs=1",
    "--set", "schedule.micro_batches_per_epoch=4", "--set", "checkpointing.tensorboard=false",
]


_TAKEN = set()


def _free_port():
    """A port P with P + 1 also free (the coordinator uses both), not given out before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if {port, port + 1} & _TAKEN:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        _TAKEN.update((port, port + 1))
        return port


# JAX's persistent compilation cache, shared by every process of this module: a process
# restarted after a kill, or one starting after another compiled the same program, loads
# the compiled code instead of compiling it again (start-up and compiling dominate).
COMPILATION_CACHE = dict(
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0"
)


def _env(**more):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    # Many processes share the cores: one TensorFlow op thread each (tf.data).
    return dict(env, PYTHONPATH=str(ROOT), KERAS_BACKEND="jax", TF_NUM_INTRAOP_THREADS="1",
                TF_NUM_INTEROP_THREADS="1", **COMPILATION_CACHE, **more)


def _start(args, cwd, tag="", **env):
    """Starts `args` in `cwd` (`env`: more variables), its output to files there (a full
    pipe would stall it), named `stdoutTAG.txt` and `stderrTAG.txt`."""
    out, err = (
        open(os.path.join(cwd, f"{name}{tag}.txt"), "w+") for name in ("stdout", "stderr")
    )
    process = subprocess.Popen(args, cwd=cwd, env=_env(**env), stdout=out, stderr=err)
    process.output = out, err
    return process


def _cli(args, cwd, tag="", **env):
    return _start([sys.executable, "-m", "keras_vit", "pretrain", *args], cwd, tag, **env)


def _readme_processes(cwd, port):
    """The README's two processes, each started on its own (`README_ARGS`)."""
    return [
        _cli(README_ARGS, cwd, str(index), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
             JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index))
        for index in (1, 0)
    ][::-1]


def _process(cwd, port, index, count, *extra):
    """`keras-vit pretrain` (`TINY`) as process `index` of `count`, process 0 at 127.0.0.1:port."""
    return _cli(
        [*TINY, "--out", "run", "--set", f"distribution.coordinator=127.0.0.1:{port}",
         "--set", f"distribution.num_processes={count}", "--set", f"distribution.process_id={index}",
         *extra],
        cwd, str(index),
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


def _kill_and_restart(runs):
    """Once process 0 of each run's `procs` has backed up position `after` (epoch, step)
    in the run's folder `backup`, SIGKILLs its process 1, then its process 0 (left waiting
    for it), and starts both again with the same command (`restart()`). `runs`: `{name:
    (backup, procs, restart, after)}`, each watched in its own thread (one run's kill and
    restart took long enough for another run to finish unwatched); returns `{name:
    (restarted processes, the backup's state file as the kill left it)}`."""
    from keras_vit.training.callbacks import TrainingBackup

    deadline = time.monotonic() + 900  # every run of the module shares the cores

    def kill_and_restart(backup, procs, restart, after):
        while TrainingBackup.saved_position(str(backup)) < after:
            assert procs[0].poll() is None and time.monotonic() < deadline, _finish(procs)
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        assert procs[1].wait() == -signal.SIGKILL
        procs[0].kill()
        procs[0].wait()
        state = dict(np.load(backup / TrainingBackup.FILE))
        return restart(), state

    with ThreadPoolExecutor(len(runs)) as pool:
        watched = {name: pool.submit(kill_and_restart, *run) for name, run in runs.items()}
        return {name: future.result() for name, future in watched.items()}


# Two epochs, backed up every 2 of their 4 micro-batches, weights and optimizer slots
# split over the 2 processes' devices.
FSDP = ["--set", "schedule.epochs=2", "--set", "checkpointing.backup_every_micro_batches=2",
        "--set", "distribution.strategy=fsdp"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts everything at once (start-up and compiling dominate), all sharing one
    compilation cache: the README's two-process run, the same command in one process,
    the two processes killed in epoch 2 and restarted, a second process with another
    batch size, a process 0 whose process 1 never comes, and two processes with FSDP
    (`TINY`) run straight, and killed after their first backup and restarted."""
    COMPILATION_CACHE["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path_factory.mktemp("jax_cache"))
    folders = {name: tmp_path_factory.mktemp(name) for name in ("one", "two", "killed", "lonely")}
    other = [tmp_path_factory.mktemp("other") for _ in range(2)]
    fsdp = {name: tmp_path_factory.mktemp(name) for name in ("fsdp", "fsdp_killed")}
    script = TWO_PROCESSES.replace("127.0.0.1:8476", f"127.0.0.1:{_free_port()}").replace(
        "keras-vit ", f"{sys.executable} -m keras_vit "
    )

    def fsdp_pair(folder):
        port = _free_port()
        return [_process(folder, port, index, 2, *FSDP) for index in (0, 1)]

    started = {
        "two": [_start(["bash", "-ec", script], folders["two"])],
        # The README's command without the JAX_ variables: one process.
        "one": [_cli(README_ARGS, folders["one"])],
        "fsdp": fsdp_pair(fsdp["fsdp"]),
    }
    killed = {
        "restarted": (folders["killed"] / "runs" / "two" / "backup",
                      _readme_processes(folders["killed"], _free_port()),
                      lambda: _readme_processes(folders["killed"], _free_port()), (1, 0)),
        "fsdp_restarted": (fsdp["fsdp_killed"] / "run" / "backup", fsdp_pair(fsdp["fsdp_killed"]),
                           # From its first backup on (mid-epoch 1): the rest of a run
                           # this small can take less than the watcher's turn.
                           lambda: fsdp_pair(fsdp["fsdp_killed"]), (0, 2)),
    }
    port = _free_port()
    started["other"] = [
        _process(other[0], port, 0, 2), _process(other[1], port, 1, 2, "--set", "data.batch_size=64")
    ]
    started["lonely"] = [
        _process(folders["lonely"], _free_port(), 0, 2, "--set", "distribution.join_timeout=5")
    ]
    restarted = _kill_and_restart(killed)
    states = {name: state for name, (_, state) in restarted.items()}
    started.update({name: procs for name, (procs, _) in restarted.items()})
    results = {name: _finish(procs) for name, procs in started.items()}
    folders = {name: folder / "runs" / "two" for name, folder in folders.items()}
    folders.update(fsdp=fsdp["fsdp"] / "run", fsdp_killed=fsdp["fsdp_killed"] / "run")
    return dict(results, folders=folders, fsdp_state=states["fsdp_restarted"])


def _weights(folder, name="model.keras"):
    from keras_vit.utils.model_files import read_keras

    return read_keras(str(folder / name)).get_weights()


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


def test_killed_processes_restarted_resume_exactly(runs):
    """Process 1 SIGKILLed in epoch 2 (process 0 then killed too), both started again with
    the same command: they resume from process 0's backup of epoch 1 and end with the
    weights of the uninterrupted run, each epoch's metrics written once."""
    for code, _, err in runs["restarted"]:
        assert code == 0, err[-3000:]
    assert "Resumed from" in runs["restarted"][1][2]  # process 1 read process 0's backup
    killed, two = runs["folders"]["killed"], runs["folders"]["two"]
    for a, b in zip(_weights(two), _weights(killed), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6)
    assert len((killed / "metrics.csv").read_text().splitlines()) == 1 + 2
    assert sorted(os.listdir(killed)) == sorted(os.listdir(two))


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


def test_fsdp_processes_killed_resume_exactly_from_sharded_backups(runs):
    """FSDP over 2 processes: the backup is sharded (the state file names the Orbax folder
    that each process wrote its shards to), process 1 SIGKILLed after the first backup and both
    restarted end with the weights and metrics of the uninterrupted run, the epoch
    checkpoints are sharded too, and the final `model.keras` holds the whole model (one
    host's copy)."""
    for code, _, err in runs["fsdp"] + runs["fsdp_restarted"]:
        assert code == 0, err[-3000:]
    assert "FullyShardedDataParallel, 2 devices in 2 processes" in runs["fsdp"][1][2]
    assert "Resumed from" in runs["fsdp_restarted"][1][2]
    state = runs["fsdp_state"]
    assert set(state) == {"epoch", "step", "sharded"}
    straight, killed = runs["folders"]["fsdp"], runs["folders"]["fsdp_killed"]
    for a, b in zip(_weights(straight), _weights(killed), strict=True):
        np.testing.assert_array_equal(b, a)
    assert (killed / "metrics.csv").read_text() == (straight / "metrics.csv").read_text()
    assert sorted(os.listdir(killed)) == sorted(os.listdir(straight))
    # Each epoch's checkpoint is a folder of both processes' shards (Orbax), nothing
    # gathered; read into one host, the last is the final model.keras.
    assert sorted(os.listdir(straight / "checkpoints")) == ["epoch_0001.orbax", "epoch_0002.orbax"]
    last = _weights(straight / "checkpoints", "epoch_0002.orbax")
    for a, b in zip(_weights(straight), last, strict=True):
        np.testing.assert_array_equal(b, a)
