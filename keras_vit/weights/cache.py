"""The weights cache folder and its index: every downloaded file pinned on first use.

The cache is `$KERAS_VIT_CACHE`, by default `<Keras cache>/models/keras_vit`. Its
`index.json` pins each file kept there: the SHA-256 and size the file had when it was
first downloaded (or first used, for a copy placed there by other means) and its URL.
A cached file that no longer matches its pin is refused, and so is a later download of
the same URL that brings another file; `keras-vit weights --verify` re-hashes every
pinned file (`verify_cache`). The index also records each file's modification time,
so that an unchanged file is used without reading it again.

The index is written atomically (`keras_vit.utils.files.atomic_write`) while holding an
advisory lock (a lock file in the cache folder), so two processes downloading at once keep both their
pins; systems without `fcntl` (Windows) are not locked, and a pin lost there is made
again on the file's next use. This module imports neither Keras nor the registry.
"""

import contextlib
import hashlib
import json
import os

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None

from keras_vit.utils.files import atomic_write

CACHE_ENV = "KERAS_VIT_CACHE"
INDEX = "index.json"
INDEX_LOCK = ".index.lock"


def cache_dir():
    """Where downloaded checkpoints are kept: `$KERAS_VIT_CACHE`, else
    `models/keras_vit` under Keras' own folder (`$KERAS_HOME`, else `~/.keras`).

    Keras' folder is found the way Keras documents it rather than through a Keras
    function: `keras.config` has no public name for it that every 3.x release keeps.
    """
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    keras_home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(keras_home, "models", "keras_vit")


def index_path():
    """The cache's index of pinned files."""
    return os.path.join(cache_dir(), INDEX)


def file_sha256(path):
    """The SHA-256 (hex) of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _key(path):
    """`path`'s name in the index: relative to the cache, with `/`."""
    return os.path.relpath(path, cache_dir()).replace(os.sep, "/")


def _read():
    """The index's pins by key; an index (or a pin) that is missing or unreadable holds
    none."""
    try:
        with open(index_path()) as f:
            files = json.load(f)["files"]
        return {key: record for key, record in files.items()
                if isinstance(record, dict) and {"sha256", "size"} <= set(record)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


@contextlib.contextmanager
def _locked(folder):
    """Holds an exclusive `flock` on `folder`'s index lock file (released when the
    process ends, however).

    Not on the folder itself: every crash-safe write holds a shared lock on the folder
    it writes in (`keras_vit.utils.files`), and the index's own write would wait on ours.
    """
    if fcntl is None:
        yield
        return
    descriptor = os.open(os.path.join(folder, INDEX_LOCK), os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _update(change):
    """Applies `change(files)` to the index under the cache's lock.

    Best effort: in a read-only cache nothing is pinned, and files are checked in full
    at each use.
    """
    folder = cache_dir()
    try:
        with _locked(folder):
            files = _read()
            change(files)
            atomic_write(index_path(), json.dumps(dict(files=files), indent=1, sort_keys=True))
    except OSError:
        pass


def pinned(path):
    """The pin of the cached file `path` (`sha256`, `size`, `mtime_ns`, `url`), or None."""
    return _read().get(_key(path))


def pin(path, digest, url):
    """Pins the cached file `path`, as it is now, with SHA-256 `digest`, downloaded from
    `url`."""
    stat = os.stat(path)
    record = dict(sha256=digest, size=stat.st_size, mtime_ns=stat.st_mtime_ns, url=url)

    def add(files):
        files[_key(path)] = record

    _update(add)
    # Earlier versions kept a record beside each file instead of the index.
    folder, name = os.path.split(path)
    with contextlib.suppress(OSError):
        os.remove(os.path.join(folder, f".{name}.verified"))


def unpin(path):
    """Forgets the pin of `path` (a file found not to be the checkpoint it was
    downloaded as), so that its next download is pinned anew."""
    _update(lambda files: files.pop(_key(path), None))


def unchanged(path, record, sha256=None):
    """Whether the file at `path` has the size and modification time its pin `record`
    (or None) holds (and the pin the SHA-256 `sha256`, when given): then it need not be
    read again."""
    if record is None:
        return False
    stat = os.stat(path)
    same = (stat.st_size, stat.st_mtime_ns) == (record["size"], record.get("mtime_ns"))
    return same and (sha256 is None or record["sha256"] == sha256.lower())


def check_pin(path, digest, record):
    """Raises `ValueError` unless the file at `path`, of SHA-256 `digest`, is the one
    its pin `record` (or None: no pin) holds.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "w.npz")
    >>> _ = open(path, "wb").write(b"weights")
    >>> digest = file_sha256(path)
    >>> check_pin(path, digest, dict(sha256=digest, size=7, url="https://x/w.npz"))
    >>> check_pin(path, digest, dict(sha256="0" * 64, size=7, url="https://x/w.npz"))
    Traceback (most recent call last):
    ...
    ValueError: its SHA-256 is ... (7 bytes), not the 000... (7 bytes) of the file first downloaded from https://x/w.npz (pinned in ...index.json)
    """
    size = os.path.getsize(path)
    if record is not None and (digest, size) != (record["sha256"], record["size"]):
        raise ValueError(
            f"its SHA-256 is {digest} ({size} bytes), not the {record['sha256']} "
            f"({record['size']} bytes) of the file first downloaded from "
            f"{record.get('url')} (pinned in {index_path()})"
        )


def verify_cache():
    """Re-hashes every file of the cache against its pin (`keras-vit weights --verify`).

    A file the index does not know (placed in the cache by hand, or by a version that
    did not pin) is not listed: it is checked in full, and pinned, on its next use.

    Returns:
        `(lines, changed)`: one line for each pinned file (`ok`, `CHANGED` with both
        hashes, or `missing`) and a summary, and the number of files that no longer
        match their pins.
    """
    folder, files = cache_dir(), _read()
    lines, counts = [], dict(ok=0, changed=0, missing=0)
    for key, record in sorted(files.items()):
        path = os.path.join(folder, *key.split("/"))
        if not os.path.isfile(path):
            counts["missing"] += 1
            lines.append(f"missing   {key} (its next download is checked against its pin)")
            continue
        try:
            check_pin(path, file_sha256(path), record)
        except ValueError as err:
            counts["changed"] += 1
            lines.append(f"CHANGED   {key}: {err}; delete it to download it again")
        else:
            counts["ok"] += 1
            lines.append(f"ok        {key}")
    lines.append(
        f"{folder}: {counts['ok']} unchanged, {counts['changed']} changed, "
        f"{counts['missing']} missing."
    )
    return lines, counts["changed"]
