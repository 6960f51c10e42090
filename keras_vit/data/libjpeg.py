"""JPEGs that decode with a libjpeg warning ("Corrupt JPEG data: ..."): kept, and named.

libjpeg decodes such a file (many whole photos carry a warning; one whose entropy data
is garbage decodes as noise) and TensorFlow prints the warning as it does, without the
file's name. `warning` decodes a JPEG at 1/8 scale with libjpeg-turbo (`simplejpeg`,
which reports warnings) and returns it. That costs several times the start-up check of
a file (`keras_vit.data.folders`; bench/folder_startup.py), so a training run checks its folder's JPEGs off the
start-up path, in a daemon thread (`BackgroundCheck`) that logs each warned file as it
finds it, records the results in the folder's listing cache (each file is checked once
across runs) and never changes what is trained.
"""

import logging
import threading

import simplejpeg

from keras_vit.data import headers
from keras_vit.data.folders import save_listing
from keras_vit.utils.paths import is_url

logger = logging.getLogger("keras_vit")

# Results saved to the listing cache every this many files checked (and at the end).
SAVE_EVERY = 4096


def message(payload):
    """libjpeg's warning on decoding the JPEG `payload` (every bit of its entropy-coded
    data, at 1/8 scale), or None: none, not a JPEG, or an error (the decoder then fails,
    which its caller reports).

    Example:

    >>> import io
    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("L", (8, 8)).save(buffer, "JPEG")
    >>> message(buffer.getvalue()) is None
    True
    """
    if headers.image_format(payload) != "jpeg":
        return None
    try:
        simplejpeg.decode_jpeg(payload, colorspace="GRAY", min_factor=8, strict=True)
        return None
    except ValueError as error:
        return str(error) or "an unnamed warning"


def decode_clean(payload, channels):
    """uint8 pixels `(height, width, channels)` of the JPEG `payload`, decoded once, where
    libjpeg decodes it without a warning; else None.

    libjpeg-turbo (`simplejpeg`) decodes with the accurate integer IDCT and smooth
    upsampling, as PIL and TensorFlow do: the bytes of
    `keras_vit.data.images.decode_file`. A colour (YCbCr) or grey JPEG is decoded to
    RGB, or to libjpeg's own grey (the luma). None for anything else: not a JPEG, a
    CMYK or YCCK one (which the callers convert as TensorFlow does), one on which
    libjpeg warns or fails (`message` and `decode_file` then say what).
    One decode where `message` and `decode_file` take two.

    Args:
        payload: the file's bytes.
        channels: 1 or 3.

    Example:

    >>> import io
    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (3, 2), (0, 0, 0)).save(buffer, "JPEG")
    >>> decode_clean(buffer.getvalue(), 3).shape
    (2, 3, 3)
    """
    if headers.image_format(payload) != "jpeg":
        return None
    try:
        if simplejpeg.decode_jpeg_header(payload)[2] not in ("YCbCr", "Gray"):
            return None
        return simplejpeg.decode_jpeg(payload, colorspace="RGB" if channels == 3 else "GRAY",
                                      strict=True)
    except ValueError:  # a warning or an error
        return None


def warning(payload):
    """`message` of the JPEG `payload` where TensorFlow's decoder, which training uses,
    decodes it (a warning, not an error), else None.

    Example:

    >>> import numpy as np, tensorflow as tf
    >>> warning(tf.io.encode_jpeg(np.zeros((8, 8, 1), np.uint8)).numpy()) is None
    True
    """
    found = message(payload)
    if found is None:
        return None
    import tensorflow as tf  # only for a warned file: the check of a clean one needs none

    try:
        tf.io.decode_jpeg(payload, channels=1, ratio=8)
    except tf.errors.OpError:
        return None
    return found


def kept_line(path, message):
    """The line naming a kept file of libjpeg's `message`."""
    return f"Kept {path}: libjpeg warns \"{message}\" on decoding it (the file is used; " \
        "TensorFlow prints that warning without the file name)."


def file_warning(path):
    """`warning` of the local file at `path`; None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return warning(f.read())
    except OSError:
        return None


class BackgroundCheck:
    """Checks the JPEGs of a folder `listing` for libjpeg warnings in a daemon thread.

    `listing.libjpeg` holds each file's result ("" none, the warning, None not checked
    yet: read from the cache, so only new or changed files are decoded). The thread logs
    one `kept_line` per warned file (those known from the cache first), fills `warned`
    (`{path: warning}`, for the run's summary), saves the results to the listing cache
    and stops at the end or at `stop`. A failure is logged, never raised: the check
    only names files.

    Args:
        listing: a `keras_vit.data.folders.Listing` of a local folder.
    """

    def __init__(self, listing):
        self.listing = listing
        self.warned = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="libjpeg check", daemon=True)

    def start(self):
        """Starts the thread (once)."""
        if not self.thread.is_alive() and not self.stopping.is_set():
            self.thread.start()

    def stop(self, timeout=10.0):
        """Asks the thread to stop after its current file and waits up to `timeout` s."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def run(self):
        listing = self.listing
        try:
            kept = set(listing.paths)
            results = listing.libjpeg
            results.extend([None] * (len(listing.files) - len(results)))
            for (path, _), result in zip(listing.files, results):
                if result and path in kept:
                    self.found(path, result)
            unsaved = 0
            for index, (path, _) in enumerate(listing.files):
                if self.stopping.is_set():
                    break
                if results[index] is not None or path not in kept or is_url(path):
                    continue
                results[index] = file_warning(path) or ""
                if results[index]:
                    self.found(path, results[index])
                unsaved += 1
                if unsaved == SAVE_EVERY:
                    save_listing(listing)
                    unsaved = 0
            if unsaved:
                save_listing(listing)
        except Exception as error:  # noqa: BLE001 (naming files must never stop a run)
            logger.info("The libjpeg check of the image files stopped: %r", error)

    def found(self, path, message):
        self.warned[path] = message
        logger.warning(kept_line(path, message))
