"""Image folders at scale: listing, a check of every file without decoding, a listing cache.

Start-up reads the folder tree and each file (local folders; a remote file's first and
last bytes), never decodes it: `headers.image_problem` names and leaves out files that
are empty, not JPEG, PNG, GIF, BMP or WebP, truncated, corrupt inside or over the pixel
limit. Class folders left without an image are not classes. The result is cached under
the folder's path and the modification times of its class folders (which change when a
file is added, removed or renamed), with each file's size and modification time, so a
resume or another worker on the host reads one small file and checks again only the
files changed in place. The cache also keeps what `keras_vit.data.libjpeg` found on
decoding each JPEG, which a training run checks off the start-up path.
"""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
from typing import Optional

from keras_vit.data import headers
from keras_vit.utils.files import atomic_write
from keras_vit.utils.paths import is_url
from keras_vit.utils.image_files import IMAGE_EXTENSIONS

logger = logging.getLogger("keras_vit")

# A remote file is judged from its first HEAD and last TAIL bytes (the end markers of
# JPEG and PNG files, which a truncated download lacks; some writers pad after them).
END_MARKERS = {"jpeg": b"\xff\xd9", "png": b"IEND"}
HEAD = 1 << 16
TAIL = 1024
# Files checked at once: the check waits on storage, not on the CPU.
CHECK_THREADS = 32
CHECK_CHUNK = 64
STAT_CHUNK = 1024
CACHE_VERSION = 2


def cache_folder():
    """Where listings are cached: `$KERAS_VIT_CACHE`, else `~/.cache/keras_vit`."""
    return os.environ.get("KERAS_VIT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "keras_vit"
    )


@dataclasses.dataclass
class Listing:
    """A class folder tree, listed and checked.

    Attributes:
        folders: every class folder name, sorted.
        files: `[path, folder index]` of every file with an image extension directly
            inside a class folder, in folder then name order.
        nested: `{folder: count}` of the sub-folders inside class folders (not read).
        ignored: `{kind: count}` of what is not an image of a class: hidden entries,
            nested folders, loose files and other file types (by extension).
        damaged: `{path: reason}` of image files left out by the check.
        stamps: `[size, mtime_ns]` of each of `files` (local) before it was checked.
        libjpeg: libjpeg's warning on decoding each of `files` ("" none; None, or missing
            at the end: not checked yet; see `keras_vit.data.libjpeg`).
        cached: whether this listing was read from the cache.
        cache_path: where the listing is cached (None: nowhere).
        classes: the class folders holding at least one kept image (labels are their
            indices); `empty` says why each other class folder was left out.
        paths: image files kept, in class then name order.
        labels: the label of each kept file.
    """

    folders: list
    files: list
    nested: dict
    ignored: dict
    damaged: dict
    stamps: list
    libjpeg: list = dataclasses.field(default_factory=list)
    cached: bool = False
    cache_path: Optional[str] = dataclasses.field(default=None, compare=False)
    classes: list = dataclasses.field(init=False)
    paths: list = dataclasses.field(init=False)
    labels: list = dataclasses.field(init=False)
    empty: dict = dataclasses.field(init=False)

    def __post_init__(self):
        kept = [row for row in self.files if row[0] not in self.damaged]  # no new rows
        used = sorted({row[1] for row in kept})
        label_of = {index: label for label, index in enumerate(used)}
        self.classes = [self.folders[index] for index in used]
        self.paths = [row[0] for row in kept]
        self.labels = [label_of[row[1]] for row in kept]
        counts = collections.Counter(row[1] for row in self.files)
        self.empty = {}
        for index, name in enumerate(self.folders):
            if index in label_of:
                continue
            if counts.get(index):
                self.empty[name] = f"its {counts[index]} image files are all damaged"
            elif self.nested.get(name):
                self.empty[name] = (
                    f"no image files directly inside, {self.nested[name]} sub-folders (not read)"
                )
            else:
                self.empty[name] = "no image files"

    def ignored_line(self, folder):
        """One line saying what was ignored in `folder`, or None."""
        if not self.ignored:
            return None
        parts = ", ".join(f"{count} {kind}" for kind, count in sorted(self.ignored.items()))
        return f"Ignored in {folder}: {parts} (classes are the sub-folders; images are " \
            f"{'/'.join(IMAGE_EXTENSIONS)} files directly inside them)."

    def empty_line(self, folder):
        """One line naming the class folders of `folder` left out as empty, or None."""
        if not self.empty:
            return None
        names = "; ".join(f"{name} ({why})" for name, why in sorted(self.empty.items()))
        return f"{len(self.empty)} class folders in {folder} hold no readable image and " \
            f"are not classes: {names}."

    def saved(self):
        """What the listing cache keeps: the fields the others are derived from."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if field.init and field.name not in ("cached", "cache_path")}


def is_folder(entry):
    """Whether the `os.DirEntry` is a folder; a symbolic link loop is judged as a file,
    as a dangling link is (the check then names it unreadable)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def scan(folder):
    """`(sub-folder names, file names)` of `folder` (local: no stat per file)."""
    if not is_url(folder):
        folders, files = [], []
        with os.scandir(folder) as entries:
            for entry in entries:
                (folders if is_folder(entry) else files).append(entry.name)
        return folders, files
    import tensorflow as tf  # its file systems; local folders are listed without it

    folders, files = [], []
    for name in tf.io.gfile.listdir(folder):
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif tf.io.gfile.isdir(os.path.join(folder, name)):
            folders.append(name)
        else:
            files.append(name)
    return folders, files


def stamp(path):
    """`[size, mtime_ns]` of a local file, or None where it cannot be read."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return [status.st_size, status.st_mtime_ns]


def damage(path):
    """Why `path` is not a readable image, or None: a local file is read whole and
    judged by `headers.image_problem`, a remote one by its first and last bytes."""
    if is_url(path):
        return remote_damage(path)
    try:  # Positioned reads, no buffering: a fraction of the syscalls of open().
        fd = os.open(path, os.O_RDONLY)
        try:
            head = os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
    except OSError as error:
        return f"unreadable ({error.strerror or error.__class__.__name__})"
    return headers.image_problem(head)


def remote_damage(path):
    """`damage` of a remote file (`gs://`, ...), judged by its first and last bytes."""
    import tensorflow as tf  # its file systems; local folders are listed without it

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            head = f.read(HEAD)
            size = f.size()  # (GFile.seek returns None)
            f.seek(max(size - TAIL, 0))
            tail = f.read()
    except OSError as error:
        return f"unreadable ({error.strerror or error.__class__.__name__})"
    except tf.errors.OpError as error:
        return f"unreadable ({error.__class__.__name__})"
    complete = size <= len(head)
    problem = headers.image_problem(head, complete=complete)
    marker = END_MARKERS.get(headers.image_format(head))
    if problem is None and not complete and marker and marker not in tail:
        problem = f"truncated {headers.image_format(head).upper()} (no end marker)"
    return problem


def in_parallel(function, items, chunk=CHECK_CHUNK):
    """`[function(item) for item in items]`, run in threads: they hide storage latency;
    chunks of `chunk` items keep the pool's own cost per item small."""
    chunks = [items[i:i + chunk] for i in range(0, len(items), chunk)]
    with concurrent.futures.ThreadPoolExecutor(CHECK_THREADS) as pool:
        results = pool.map(lambda chunk: [function(item) for item in chunk], chunks)
        return [result for chunk_results in results for result in chunk_results]


def find_damaged(paths):
    """`{path: reason}` for the files of `paths` that `damage` finds, checked in parallel.

    Example:

    >>> find_damaged([])
    {}
    """
    paths = list(paths)
    return {path: reason for path, reason in zip(paths, in_parallel(damage, paths)) if reason}


def stamps_of(paths):
    """`[size, mtime_ns]` (None where unreadable) of each local file of `paths`."""
    return [] if not paths or is_url(paths[0]) else in_parallel(stamp, paths, STAT_CHUNK)


def list_folder(folder):
    """Lists and checks the class folder tree at `folder` (no cache; see `load_listing`)."""
    folders, files = scan(folder)
    ignored, nested, found = {}, {}, []

    def ignore(kind, count=1):
        ignored[kind] = ignored.get(kind, 0) + count

    classes = sorted(name for name in folders if not name.startswith("."))
    ignore_counts = {
        "hidden entries": sum(name.startswith(".") for name in folders + files),
        "loose files beside the class folders": sum(not name.startswith(".") for name in files),
    }
    for index, name in enumerate(classes):
        class_folder = os.path.join(folder, name)
        sub_folders, names = scan(class_folder)
        ignore_counts["hidden entries"] += sum(n.startswith(".") for n in sub_folders + names)
        nested[name] = sum(not n.startswith(".") for n in sub_folders)
        ignore("nested folders", nested[name])
        for file in sorted(n for n in names if not n.startswith(".")):
            extension = os.path.splitext(file)[1].lower()
            if extension in IMAGE_EXTENSIONS:
                found.append([os.path.join(class_folder, file), index])
            else:
                ignore(f"{extension or 'extension-less'} files")
    for kind, count in ignore_counts.items():
        ignore(kind, count)
    ignored = {kind: count for kind, count in ignored.items() if count}
    paths = [path for path, _ in found]
    stamps = stamps_of(paths)  # before the check: a file changed during it is checked again
    damaged = find_damaged(paths)
    nested = {name: count for name, count in nested.items() if count}
    return Listing(classes, found, nested, ignored, damaged, stamps)


def folder_key(folder):
    """What the listing of `folder` depends on: its path and its class folders' mtimes,
    or None where modification times cannot be read (then nothing is cached)."""
    if is_url(folder):
        return None
    root = os.path.abspath(folder)
    try:
        with os.scandir(root) as entries:
            stamps = sorted(
                (entry.name, entry.stat().st_mtime_ns) for entry in entries if is_folder(entry)
            )
        text = json.dumps(
            dict(version=CACHE_VERSION, folder=folder, root=root,
                 mtime=os.stat(root).st_mtime_ns, folders=stamps)
        )
    except OSError:
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def recheck(listing):
    """`listing` with the files whose size or mtime changed since it was made checked
    again (a file rewritten or truncated in place keeps its folder's mtime), or None
    when none changed."""
    paths = [path for path, _ in listing.files]
    stamps = stamps_of(paths)
    changed = [path for path, now, then in zip(paths, stamps, listing.stamps) if now != then]
    if not changed:
        return None
    again = set(changed)
    damaged = {path: why for path, why in listing.damaged.items() if path not in again}
    damaged.update(find_damaged(changed))
    order = {path: i for i, path in enumerate(paths)}
    damaged = dict(sorted(damaged.items(), key=lambda item: order[item[0]]))
    libjpeg = [None if path in again else result for path, result in zip(paths, listing.libjpeg)]
    return dataclasses.replace(listing, damaged=damaged, stamps=stamps, libjpeg=libjpeg)


def load_listing(folder, cache_dir: Optional[str] = None):
    """`list_folder(folder)`, read from the listing cache when the folder is unchanged.

    The files of a cached listing whose size or modification time changed are checked
    again. Writing the cache is best effort (`save_listing`).
    """
    key = folder_key(folder)
    path = key and os.path.join(cache_dir or cache_folder(), "listings", f"{key}.json")
    listing = None
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                listing = Listing(**json.load(f), cached=True)
        except (OSError, ValueError, TypeError, KeyError, IndexError):
            listing = None
    if listing is not None:
        updated = recheck(listing)
        if updated is None:
            listing.cache_path = path
            return listing
        listing = updated
    else:
        listing = list_folder(folder)
    listing.cache_path = path
    save_listing(listing)
    return listing


def save_listing(listing):
    """Writes `listing` to its `cache_path` (where it has one), best effort: an
    unwritable cache folder only costs the next start-up a new listing."""
    if not listing.cache_path:
        return
    try:
        os.makedirs(os.path.dirname(listing.cache_path), exist_ok=True)
        atomic_write(listing.cache_path, json.dumps(listing.saved()))
    except OSError as error:
        logger.info("Listing not cached in %s (%s).", listing.cache_path, error)
