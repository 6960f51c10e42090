"""Ctrl-C and SIGTERM: raise `KeyboardInterrupt` and remember the signal.

Python raises a signal's `KeyboardInterrupt` wherever the main thread happens to be, and
library code that clears Python errors can lose it: a Ctrl-C during TensorFlow
training could go unnoticed and the run finish with status 0 (docs/training.md, "Stopped by
Ctrl-C or SIGTERM"). `catching_signals`
remembers each signal, so that a training callback (`StopOnSignal`) raises it again at the
next batch.
"""

import contextlib
import signal
import threading

# The signals received inside `catching_signals`, in order.
received = []


def _raise(signum, frame):
    received.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def catching_signals():
    """Inside, SIGINT and SIGTERM raise `KeyboardInterrupt` in the main thread and are
    recorded in `received` (emptied on entry and on exit, so that a later run in the same
    process is not stopped by them); outside a main thread it does nothing.

    Example:

    >>> import os
    >>> with catching_signals():
    ...     try:
    ...         os.kill(os.getpid(), signal.SIGTERM)
    ...     except KeyboardInterrupt:
    ...         pass
    ...     signal.Signals(received[0]).name
    'SIGTERM'
    >>> received
    []
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received.clear()
    previous = {signum: signal.signal(signum, _raise) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        received.clear()


def raise_if_signalled():
    """Raises `KeyboardInterrupt` if a signal came inside `catching_signals`."""
    if received:
        raise KeyboardInterrupt
