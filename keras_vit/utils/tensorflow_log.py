"""TensorFlow's C++ log lines kept out of a program's output (`tensorflow_log_dropped`).

TensorFlow 2.20's libraries print their start-up lines (oneDNN, CUDA drivers, cuInit)
to file descriptor 2 at every import, whatever `TF_CPP_MIN_LOG_LEVEL` says, and the
first device lookup may print more later, so the filter covers the whole run rather
than an import.
"""

import contextlib
import os
import re
import sys
import threading

# What TensorFlow's C++ libraries print: absl/glog lines (severity I, W or E, then the
# date; `failed call to cuInit` among them) and the notes around them. TensorFlow prints
# them at each import of its two libraries and when it first looks for devices, and
# TF_CPP_MIN_LOG_LEVEL no longer holds them back (tensorflow/tensorflow#100442).
_NOTES = (
    b"WARNING: All log messages before absl::InitializeLog",
    b"To enable the following instructions",
    b"INFO: Created TensorFlow Lite",  # the LiteRT interpreter's delegate, at each start
)
_STARTUP_LINE = re.compile(rb"^(?:[IWE]\d{4} |" + b"|".join(map(re.escape, _NOTES)) + rb")")
_RECORD_START = re.compile(rb"[IWE]\d{0,4}\Z")


def _may_be_log_line(start):
    """Whether a line that begins with `start` may be one `_STARTUP_LINE` matches: C's
    stderr is unbuffered, so a line may come in several writes."""
    return bool(_STARTUP_LINE.match(start) or _RECORD_START.match(start)
                or any(note.startswith(start) for note in _NOTES))


@contextlib.contextmanager
def tensorflow_log_dropped():
    """Drops TensorFlow's C++ log lines (`_STARTUP_LINE`) from the process's standard
    error while the block runs, whenever TensorFlow starts in it; everything else
    written there is passed on as it comes.

    It acts only where the user did not set `TF_CPP_MIN_LOG_LEVEL` (which is then set
    to 3 while the block runs: TensorFlow's errors reach the user as Python
    exceptions); a user who set it sees what TensorFlow prints at that level. Every
    `keras-vit` command runs in it; a script can too, as often as it likes.

    Example:

    >>> with tensorflow_log_dropped():
    ...     import tensorflow as tf
    ...     print(int(tf.constant(2) + 1))
    3
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    # The C++ libraries write to file descriptor 2 itself: a thread reads it through a pipe.
    passing = threading.Thread(target=_pass_on, args=(read_end, os.dup(stderr)), daemon=True)
    passing.start()
    try:
        yield
    finally:
        # Unset again, so that the next block does not take it for the user's.
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
        sys.stderr.flush()
        os.dup2(stderr, 2)  # closes the pipe, so the thread reads to its end and stops
        os.close(stderr)
        # A process the command started and left running may hold the pipe open.
        passing.join(timeout=10)


class _Records:
    """Tells, line by line, whether a line is TensorFlow's: a log line, or one of the
    lines that continue its record (a status's `\\t [[{{node NAME}}]]` and the like,
    indented by a tab)."""

    def __init__(self):
        self.dropping = False

    def dropped(self, line):
        self.dropping = bool(_STARTUP_LINE.match(line)) or (
            self.dropping and line.startswith(b"\t")
        )
        return self.dropping


def _pass_on(read_end, target):
    """Copies what comes through `read_end` to `target`, less TensorFlow's log lines."""
    records = _Records()
    with open(read_end, "rb", buffering=0) as source, open(target, "wb") as out:
        pending = b""
        while chunk := source.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            out.write(b"".join(x + b"\n" for x in lines if not records.dropped(x)))
            if pending and not _may_be_log_line(pending):  # a prompt, a progress bar
                out.write(pending)
                pending = b""
            out.flush()
        if not _STARTUP_LINE.match(pending):
            out.write(pending)
