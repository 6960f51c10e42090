"""The suite's processes share the cores: under `-n N` (the README's test command) each
xdist worker, and every process its tests start, runs OpenMP on its share of the cores
(tests/conftest.py)."""

import os
import subprocess
import sys

import pytest

from helpers import worker_threads


@pytest.mark.parametrize("environ, cores, threads", [
    ({"PYTEST_XDIST_WORKER_COUNT": "2"}, 2, 1),
    ({"PYTEST_XDIST_WORKER_COUNT": "6"}, 16, 2),
    ({"PYTEST_XDIST_WORKER_COUNT": "4"}, 2, 1),  # more workers than cores: one each
    ({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, 2, None),  # the user's
    ({}, 2, None),  # no xdist: one process has every core
])
def test_a_worker_gets_its_share_of_the_cores(environ, cores, threads):
    assert worker_threads(environ, cores) == threads


def test_a_process_a_test_starts_runs_pytorch_on_the_workers_threads():
    pytest.importorskip("torch")
    if "PYTEST_XDIST_WORKER_COUNT" not in os.environ:
        pytest.skip("the share is an xdist worker's (the README's test command)")
    threads = os.environ.get("OMP_NUM_THREADS")  # tests/conftest.py's, or the user's
    assert threads, "tests/conftest.py set no OMP_NUM_THREADS in this xdist worker"
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, check=True,
    )
    assert int(child.stdout) == int(threads)
