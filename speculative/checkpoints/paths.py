"""Files and directories of checkpoints, local or `gs://bucket/...`: the one place that opens
them, so every reader (T5X, Orbax, config.gin) takes both kinds of path.

Cloud Storage goes through tensorstore's `gcs` kvstore (the credentials tensorstore finds:
`gcloud auth application-default login`, or a service account on the VM); nothing here needs
TensorFlow's `tf.io.gfile`.
"""

from __future__ import annotations

import io
import os
from typing import Any, Dict, Optional, Tuple

import tensorstore as ts


def is_gcs(path: str) -> bool:
    return os.fspath(path).startswith("gs://")


def _gcs(path: str) -> Tuple[dict, str]:
    bucket, _, key = path[len("gs://"):].partition("/")
    return {"driver": "gcs", "bucket": bucket}, key.strip("/")


def kvstore(path: str) -> Dict[str, Any]:
    """A tensorstore kvstore spec for a local dir or a `gs://bucket/...` URL."""
    if is_gcs(path):
        spec, key = _gcs(path)
        return {**spec, "path": key + "/"}
    return {"driver": "file", "path": os.path.abspath(path) + "/"}


def listdir(path: str) -> Optional[list]:
    """Entries of a directory, or None when it is not one."""
    if not is_gcs(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else None
    spec, key = _gcs(path)
    lo = key + "/" if key else ""
    keys = ts.KvStore.open(spec).result().list(ts.KvStore.KeyRange(
        lo, key + "0" if key else ""), strip_prefix_length=len(lo)).result()
    return sorted({k.decode().split("/")[0] for k in keys}) or None


def is_file(path: str) -> bool:
    if not is_gcs(path):
        return os.path.isfile(path)
    spec, key = _gcs(path)
    return bool(ts.KvStore.open(spec).result().list(ts.KvStore.KeyRange(key, key + "\0")).result())


def exists(path: str) -> bool:
    """Whether `path` is a file or a directory, local or gs://."""
    if not is_gcs(path):
        return os.path.exists(path)
    return is_file(path) or listdir(path) is not None


def open_file(path: str):
    """A binary file object, local or gs:// (read whole: checkpoints' small files)."""
    if not is_gcs(path):
        return open(path, "rb")
    spec, key = _gcs(path)
    return io.BytesIO(ts.KvStore.open(spec).result().read(key).result().value)


def read_text(path: str) -> str:
    """A text file's contents (UTF-8), local or gs://."""
    with open_file(path) as f:
        return f.read().decode("utf-8")


def join(path: str, *names: str) -> str:
    """`path/name/...` with '/' for gs:// and the OS separator locally."""
    return "/".join([path.rstrip("/"), *names]) if is_gcs(path) else os.path.join(path, *names)


def parent(path: str) -> str:
    """The directory holding `path` (a gs:// URL keeps its bucket)."""
    path = os.fspath(path).rstrip("/") or "/"
    if is_gcs(path):
        head = path.rsplit("/", 1)[0]
        return head if len(head) > len("gs://") else path
    return os.path.dirname(os.path.abspath(path))
