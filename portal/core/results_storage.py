"""Where job results are kept (design §14): Django's storage ``results`` (``settings.STORAGES``).

By default an :class:`AtomicFileSystemStorage` under ``MEDIA_ROOT/results``; with
``RECLAIMNET_RESULTS_S3_BUCKET`` set, django-storages' S3 backend (any S3-compatible object store; the optional
extra ``s3`` installs it). Names are content-addressed (``jobs/<job id>/<sha256>``), so writing a name again
writes the same bytes: overwriting is harmless and a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

from django.core.files.base import File
from django.core.files.storage import FileSystemStorage, Storage, storages


class AtomicFileSystemStorage(FileSystemStorage):
    """FileSystemStorage whose writes are atomic: a temp file beside the target, fsync, rename over it.

    A name is never renamed to a free alternative: the caller's name is the object's identity."""

    def get_available_name(self, name: str, max_length: int | None = None) -> str:
        return name

    def _save(self, name: str, content: File[Any]) -> str:
        full_path = self.path(name)
        directory = os.path.dirname(full_path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".upload-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                if hasattr(content, "seek"):
                    content.seek(0)
                for chunk in content.chunks():
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if self.file_permissions_mode is not None:
                os.chmod(tmp_path, self.file_permissions_mode)
            os.replace(tmp_path, full_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)
            raise
        with contextlib.suppress(OSError):  # the rename is durable once the directory is synced
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return name


def results_storage() -> Storage:
    """The configured results storage (``STORAGES["results"]``)."""
    return storages["results"]
