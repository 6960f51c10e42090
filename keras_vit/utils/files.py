"""Crash-safe files: write under a temporary name, then rename into place.

A reader, or a run started again after a crash, finds either the previous version of a
file or the new one, never a part. Temporary files are named `.tmp-RANDOM-NAME` beside
their target (the same folder, so the rename is atomic; the name keeps its extension,
which `keras.Model.save` requires); a local one is created by `tempfile` (a name no other
process can predict, opened exclusively), so that a file or link planted in a shared
folder is never written through. A process killed while writing leaves one behind,
which the next write to the same target deletes, once no live process writes in that
folder (`_remove_stale`); `remove_temporaries` does so for every target in a run folder
when a run takes it.

Local paths are flushed to disk (`fsync`) before the rename; other paths (`gs://`, ...)
go through `tf.io.gfile` (`keras_vit.utils.paths`).

Test hook: with `KERAS_VIT_TEST_KILL_AT="PATTERN:N"` in the environment, the process
SIGKILLs itself while writing the `N`-th file (counting from 1, in this process) whose
name matches the `fnmatch` pattern `PATTERN`, after half of that file's temporary copy
has been written. It lets tests kill a real run in the middle of a real write
(tests/test_resume.py); it has no other use.
"""

import contextlib
import ctypes
import fnmatch
import logging
import os
import re
import secrets
import shutil
import signal
import tempfile

from keras_vit.utils import paths

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; killed writers' temporaries then stay.
    fcntl = None

logger = logging.getLogger("keras_vit")

TEMP_PREFIX = ".tmp-"
KILL_AT = "KERAS_VIT_TEST_KILL_AT"
_writes = {}


def _umask():
    # Read by setting it back at once: Python has no call that only reads it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def create_temporary(path, folder=False):
    """Creates the temporary file (or `folder`) `path` is written under before it is
    renamed into place.

    A local one is made by `tempfile.mkstemp` (`mkdtemp`) in `path`'s folder, exclusively
    and under an unpredictable name, then given the permissions a new file (folder) gets:
    `tempfile` makes it private. A URL's (`gs://`, ...) is only named, with the same
    random part.

    Returns:
        The temporary path; the caller writes it (replacing the empty file, or filling
        the empty folder).

    Example:

    >>> import tempfile
    >>> temporary = create_temporary(os.path.join(tempfile.mkdtemp(), "model.keras"))
    >>> name = os.path.basename(temporary)
    >>> name.startswith(".tmp-"), name.endswith("-model.keras"), os.path.getsize(temporary)
    (True, True, 0)
    """
    parent, name = os.path.split(str(path))
    if paths.is_url(path):
        return os.path.join(parent, f"{TEMP_PREFIX}{secrets.token_hex(8)}-{name}")
    # The target's folder is made as a writer of `path` itself would make it.
    os.makedirs(parent or ".", exist_ok=True)
    where = dict(prefix=TEMP_PREFIX, suffix=f"-{name}", dir=parent or ".")
    if folder:
        temporary = tempfile.mkdtemp(**where)
        os.chmod(temporary, 0o777 & ~_umask())
        return temporary
    descriptor, temporary = tempfile.mkstemp(**where)
    os.close(descriptor)
    os.chmod(temporary, 0o666 & ~_umask())
    return temporary


def _open_folder(folder):
    """A descriptor of `folder` to `flock`, or None where there are no locks."""
    if fcntl is None or paths.is_url(folder):
        return None
    try:
        return os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. a folder one may write but not list
        return None


def _lock(descriptor, operation):
    """`flock`; False where it cannot be taken (busy, or a file system without locks)."""
    try:
        fcntl.flock(descriptor, operation)
        return True
    except OSError:
        return False


def _remove_stale(descriptor, folder, name=None):
    """Deletes the temporaries that killed writers left in `folder` (those
    `create_temporary` made for a target `name`, or for any target) and returns them;
    nothing unless `descriptor`, `folder`'s, can be locked exclusively.

    Every writer holds a shared `flock` on the folder of its temporary while it writes
    (`_writing`), and the system drops it when its process ends, however it ends: the
    exclusive lock proves that no live process writes a temporary there, so that every
    temporary left is a killed writer's. Where another writer holds the lock, they wait
    for the next write. No live writer's file is ever taken for a stale one, as an age
    limit would (a large export can run for many minutes before its temporary changes).
    """
    if descriptor is None or not _lock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB):
        return []
    # `tempfile`'s random part: 8 of [a-z0-9_]; `old-NAME`: `atomic_folder`'s aside copy.
    target = ".+" if name is None else re.escape(name)
    pattern = re.compile(rf"{re.escape(TEMP_PREFIX)}[a-z0-9_]{{8}}-(?:old-)?{target}")
    removed = []
    for entry in sorted(os.listdir(folder)):
        if not pattern.fullmatch(entry):
            continue
        stale = os.path.join(folder, entry)
        try:
            if os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale)
            else:
                os.remove(stale)
        except OSError:  # another user's, in a shared folder
            continue
        removed.append(stale)
    return removed


@contextlib.contextmanager
def _writing(path):
    """Holds `path`'s folder as a writer of temporaries (a shared `flock`) while the body
    runs, after deleting those that killed writers of `path` left (`_remove_stale`).
    URLs, and systems or file systems without `flock`, are neither locked nor cleared.

    Example:

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "model.npz")
    >>> _ = create_temporary(target)  # left by a killed write
    >>> with _writing(target):
    ...     os.listdir(os.path.dirname(target))
    []
    """
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not paths.is_url(path):
        os.makedirs(folder, exist_ok=True)
    descriptor = _open_folder(folder)
    try:
        for stale in _remove_stale(descriptor, folder, os.path.basename(path)):
            logger.info("Removed %s, left by a write killed before it finished.", stale)
        if descriptor is not None:
            # Blocks only while another writer clears its target's temporaries.
            _lock(descriptor, fcntl.LOCK_SH)
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)


def _kill_if_asked(path, temporary):
    """The test hook (see the module docstring): dies after truncating `temporary` to half."""
    spec = os.environ.get(KILL_AT)
    if not spec:
        return
    pattern, _, count = spec.rpartition(":")
    name = os.path.basename(str(path))
    if not fnmatch.fnmatch(name, pattern):
        return
    _writes[pattern] = _writes.get(pattern, 0) + 1
    if _writes[pattern] != int(count):
        return
    if not paths.is_url(temporary) and os.path.isfile(temporary):
        size = os.path.getsize(temporary)
        with open(temporary, "r+b") as f:
            f.truncate(size // 2)
            os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def _replace(temporary, path):
    if not paths.is_url(path):
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
    paths.rename(temporary, path)


def _remove(path):
    if paths.is_url(path):
        if paths.exists(path):
            paths.remove(path)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path to write; on success it replaces `path` in one rename.

    If the body raises, the temporary file is removed and `path` is left as it was.

    Example:

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "notes.txt")
    >>> with atomic_path(target) as temporary:
    ...     with open(temporary, "w") as f:
    ...         _ = f.write("all or nothing")
    >>> open(target).read(), os.listdir(os.path.dirname(target))
    ('all or nothing', ['notes.txt'])
    """
    with _writing(path):
        temporary = create_temporary(path)
        try:
            yield temporary
            _kill_if_asked(path, temporary)
            _replace(temporary, path)
        finally:
            _remove(temporary)


def atomic_write(path, data):
    """Writes `data` (bytes or str) to `path` atomically (see `atomic_path`).

    Example:

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "config.json")
    >>> atomic_write(target, '{"epochs": 3}')
    >>> open(target).read()
    '{"epochs": 3}'
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_path(path) as temporary:
        paths.write_bytes(temporary, data)


def remove_temporaries(folder, skip=()):
    """Deletes the temporaries that killed writers left under `folder`; returns them.

    As the next write to a target does for its own (`_remove_stale`: never a live
    writer's), for every target under `folder`: a run does so when it takes its folder.
    Sub-folders whose names start with one of `skip` are left alone (other processes'
    own folders).

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = create_temporary(os.path.join(folder, "model.keras"))
    >>> [os.path.basename(p)[:5] for p in remove_temporaries(folder)], os.listdir(folder)
    (['.tmp-'], [])
    """
    if paths.is_url(folder):
        return []
    removed = []
    for root, folders, _ in os.walk(folder):
        descriptor = _open_folder(root)
        try:
            removed += _remove_stale(descriptor, root)
        finally:
            if descriptor is not None:
                os.close(descriptor)
        folders[:] = [f for f in folders if not f.startswith(tuple(skip))
                      and os.path.isdir(os.path.join(root, f))]
    return removed


def _exchange(first, second):
    """Swaps two paths in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`); False
    where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second),
                       rename_exchange)
    return result == 0


@contextlib.contextmanager
def atomic_folder(path):
    """Yields a temporary folder to fill; on success it replaces the folder `path`.

    As `atomic_path` for a folder (a SavedModel): the new folder is built beside `path`
    and swapped with the old one in one atomic exchange where the system has one
    (Linux), so a reader, or a process killed at any moment, finds the old folder or
    the new one whole; elsewhere the old folder is renamed aside first, a moment
    without either. If the body raises, `path` is left as it was. Other paths
    (`gs://`, ...) are written in place.

    Example:

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "export")
    >>> with atomic_folder(target) as temporary:
    ...     open(os.path.join(temporary, "saved_model.pb"), "w").close()
    >>> os.listdir(target), sorted(os.listdir(os.path.dirname(target)))
    (['saved_model.pb'], ['export'])
    """
    if paths.is_url(path):
        yield path
        return
    path = os.path.abspath(os.fspath(path))
    with _writing(path):
        temporary = create_temporary(path, folder=True)
        try:
            yield temporary
            _kill_if_asked(path, temporary)
            if not os.path.isdir(path):
                os.replace(temporary, path)
            elif not _exchange(temporary, path):
                # A rename replaces the empty folder made for it.
                aside = create_temporary(
                    os.path.join(os.path.dirname(path), "old-" + os.path.basename(path)),
                    folder=True,
                )
                os.replace(path, aside)
                os.replace(temporary, path)
                temporary = aside
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
