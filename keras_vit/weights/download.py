"""Fetching checkpoint files: a verified download into a cache, and `hf:` / `timm:` sources.

Files are downloaded with `keras.utils.get_file` (progress bar on stderr) into
`$KERAS_VIT_CACHE`, by default `<Keras cache>/models/keras_vit` (`~/.keras` or
`$KERAS_HOME`), at the path the file has under `https://storage.googleapis.com/vit_models/`
(e.g. `augreg/B_16-....npz`). A file found there is used without any network request.
A download goes to a temporary name and is moved into place only once it is verified:
against the SHA-256 when the registry knows it, otherwise by reading the whole archive
(every `.npz` member's CRC; a `.safetensors` header against the file length), so an
interrupted, truncated or corrupt download is never kept. Every file is pinned on first
use (`keras_vit.weights.cache`): its SHA-256 and size go into the cache's `index.json`,
and a cached file that no longer matches them, or a later download of the same URL that
brings another file, is refused. A cached file is checked again on its first use after
its size or modification time changed. A plain `http://` download is refused unless
the registry has the file's SHA-256 (or the server is on the loopback interface).
`KERAS_VIT_WEIGHTS_MIRROR=BASE_URL` replaces the official prefix, for mirrors and
air-gapped sites. `hf:ORG/NAME` and `timm:NAME` go through `huggingface_hub` (and its
own cache), the optional extra `pip install "keras3-vit[hf]"`.
"""

import contextlib
import hashlib
import ipaddress
import json
import os
import sys
import tempfile
import urllib.parse
import zipfile

from keras_vit.utils.extras import optional_import
from keras_vit.utils.files import atomic_path
from keras_vit.weights import cache, registry
from keras_vit.weights.cache import CACHE_ENV, cache_dir

MIRROR_ENV = "KERAS_VIT_WEIGHTS_MIRROR"


class DownloadError(FileNotFoundError):
    """A checkpoint is not in the cache and could not be downloaded (or failed its check)."""


def download_url(url):
    """`url` with `https://storage.googleapis.com/vit_models/` replaced by
    `$KERAS_VIT_WEIGHTS_MIRROR` when that is set.

    Example:

    >>> download_url("https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz")
    'https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz'
    """
    mirror = os.environ.get(MIRROR_ENV)
    if mirror and url.startswith(registry.OFFICIAL_BASE):
        return mirror.rstrip("/") + "/" + url[len(registry.OFFICIAL_BASE):]
    return url


def cache_path(url):
    """The file a download of `url` is kept as (whether or not it is there yet)."""
    if url.startswith(registry.OFFICIAL_BASE):
        relative = url[len(registry.OFFICIAL_BASE):]
    else:  # other URLs: one folder per URL, keeping the file name
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        relative = f"urls/{digest}/{url.rsplit('/', 1)[-1].split('?')[0] or 'weights'}"
    return os.path.join(cache_dir(), *relative.split("/"))


def cached(entry):
    """The cached file of a registry entry, or None when it is not downloaded."""
    path = cache_path(entry.url)
    return path if os.path.isfile(path) else None


def verify(path, sha256=None, size=None):
    """Raises `ValueError` unless the file at `path` is complete; returns its SHA-256.

    With `sha256` (and `size`, in bytes), they decide; otherwise an `.npz` (zip) archive is
    read in full (every member's CRC) and a `.safetensors` file's header must account for
    its length.
    """
    if size is not None and os.path.getsize(path) != size:
        raise ValueError(f"it holds {os.path.getsize(path)} bytes, the registry says {size}")
    digest = cache.file_sha256(path)
    if sha256 is not None:
        if digest != sha256.lower():
            raise ValueError(f"its SHA-256 is {digest}, the registry says {sha256}")
        return digest
    check_complete(path)
    return digest


def check_complete(path):
    """Raises `ValueError` unless `path` is a whole `.npz` archive or `.safetensors` file."""
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise ValueError(f"it is not a complete .npz archive ({err})") from None
        if bad is not None:
            raise ValueError(f"its member {bad!r} fails the CRC check")
        return
    if len(magic) == 8:  # safetensors: u64 header length, JSON header, tensor data
        length = int.from_bytes(magic, "little")
        size = os.path.getsize(path)
        if 8 + length <= size:
            with open(path, "rb") as f:
                f.seek(8)
                try:
                    header = json.loads(f.read(length))
                except ValueError:
                    header = None
            if isinstance(header, dict):
                end = max(
                    (t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
                    default=0,
                )
                if 8 + length + end == size:
                    return
                raise ValueError(f"it holds {size} bytes, its header describes {8 + length + end}")
    raise ValueError("it is neither a complete .npz archive nor a .safetensors file")


def fetch(url, *, sha256=None, size=None):
    """The local path of `url`'s file, downloaded into the cache once and verified.

    The file is pinned on first use (`keras_vit.weights.cache`): a file already in the
    cache is verified again (as a download is), and against its pin, on its first use
    after its size or modification time changed; a download of a URL pinned before (its
    file since deleted) must bring the pinned file.

    Args:
        url: an `https://` (or `http://`) URL; official URLs go to the mirror when
            `KERAS_VIT_WEIGHTS_MIRROR` is set.
        sha256: the file's expected SHA-256, or None to verify by reading it in full.
        size: the file's expected size in bytes, or None.

    Returns:
        The cached file's path. Nothing is downloaded when it is already there.

    Raises:
        DownloadError: one line naming the URL (or the cached file) and what to do:
            the cache path where a copy downloaded by other means is picked up, that
            a cached file failing its check is to be deleted, or that the URL now
            serves another file than its pin.
    """
    final = cache_path(url)
    if os.path.isfile(final):
        pin = cache.pinned(final)
        if not cache.unchanged(final, pin, sha256):
            try:
                digest = verify(final, sha256, size)
                if sha256 is None:  # the registry's hash decides where there is one
                    cache.check_pin(final, digest, pin)
            except ValueError as err:
                raise DownloadError(
                    f"The cached file {final} fails its check: {err}; delete it to download "
                    "it again."
                ) from None
            cache.pin(final, digest, url)
        return final
    folder = os.path.dirname(final)
    try:
        os.makedirs(folder, exist_ok=True)
        # Tried before downloading: a download the cache cannot keep would be wasted.
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:  # read-only, not a folder, no permission, full
        raise DownloadError(
            f"The weights cache {cache_dir()} cannot be written ({err.strerror}: "
            f"{err.filename or folder}); set {CACHE_ENV} to a writable folder."
        ) from None
    origin = download_url(url)
    check_transport(origin, sha256)
    where = f"a copy placed at {final} is used without downloading"
    import keras  # here: listing and finding cached files (keras-vit weights) runs without Keras

    with atomic_path(final) as partial:
        try:
            # The progress bar goes to stderr, as pip's and huggingface_hub's do: stdout
            # stays the command's output (e.g. predict --json).
            with contextlib.redirect_stdout(sys.stderr):
                keras.utils.get_file(
                    fname=os.path.basename(partial), origin=origin,
                    cache_dir=os.path.dirname(partial), cache_subdir="", force_download=True,
                )
        except Exception as err:
            # get_file re-raises urllib's errors as "URL fetch failure on ..."; their
            # reason (refused, HTTP 404, retrieval incomplete) is what the user needs.
            cause = err.__context__ if hasattr(err.__context__, "reason") else err
            reason = getattr(cause, "reason", cause)
            if getattr(cause, "code", None) is not None:
                reason = f"HTTP {cause.code} {reason}"
            reason = " ".join(str(reason).split()) or type(err).__name__
            raise DownloadError(f"Cannot download {origin} ({reason}); {where}.") from None
        try:
            digest = verify(partial, sha256, size)
        except ValueError as err:
            raise DownloadError(
                f"The download of {origin} is incomplete or corrupt and was not kept: {err}; "
                f"{where}."
            ) from None
        if sha256 is None:
            try:
                # A URL pinned before (its file since deleted) must bring the same file.
                cache.check_pin(partial, digest, cache.pinned(final))
            except ValueError as err:
                raise DownloadError(
                    f"The download of {origin} was not kept: {err}. The file served there has "
                    f"changed; if the new one is right, delete {cache.index_path()} (every "
                    "cached file is pinned again, as it is then, on its next use)."
                ) from None
    cache.pin(final, digest, url)
    return final


def check_transport(origin, sha256):
    """Raises `DownloadError` for a plain `http://` download with no SHA-256 to check.

    Anything on the way can replace such a file with another valid checkpoint; a
    loopback address (a mirror on this machine) is exempt, as nothing is on its way.

    Example:

    >>> check_transport("http://127.0.0.1:8000/ViT-B_16.npz", None)
    >>> check_transport("http://mirror.example/ViT-B_16.npz", "ab" * 32)
    """
    parts = urllib.parse.urlsplit(origin)
    if parts.scheme != "http" or sha256 is not None:
        return
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise DownloadError(
            f"Refusing to download {origin} over plain http:// with no SHA-256 to check it "
            "against (the registry has none for it): use an https:// mirror, or register "
            "the entry with its sha256."
        )


def refuse_cached(entry, given=()):
    """A line on the cached file of registry `entry` when it does not load into the
    model the entry describes, built with the other arguments `given` (names); None when
    the entry's file is not cached.

    Without a SHA-256 in the entry the file is the one at fault: its pin is dropped, so
    that once it is deleted the next download is pinned anew.
    """
    path = cached(entry)
    if path is None:
        return None
    unless = f" (unless {', '.join(sorted(given))} changed it)" if given else ""
    if entry.sha256 is not None:
        return (
            f"The cached file {path} has the SHA-256 of the entry {entry.name!r}: it is the "
            f"entry that does not describe its checkpoint{unless}; register it corrected."
        )
    cache.unpin(path)
    return (
        f"The cached file {path}, downloaded for {entry.name!r}, is not the checkpoint the "
        f"entry describes{unless}: delete it (or move it aside) to download it again."
    )


def fetch_hub(source):
    """`hf:ORG/NAME` (an HF transformers model folder) or `timm:NAME` (timm's
    `model.safetensors` in `timm/NAME`), downloaded by `huggingface_hub` into its cache."""
    kind, _, repo = source.partition(":")
    hub = optional_import("huggingface_hub", "Loading hf: or timm: weights")
    try:
        if kind == "timm":
            repo = repo if "/" in repo else f"timm/{repo}"
            return hub.hf_hub_download(repo, "model.safetensors")
        return hub.snapshot_download(repo, allow_patterns=["*.safetensors", "*.json"])
    except Exception as err:  # the hub's errors: offline, unknown repository, ...
        reason = " ".join(str(err).split())[:300]
        raise DownloadError(f"Cannot get {source} from the Hugging Face Hub ({reason}).") from None
