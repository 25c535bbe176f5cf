"""``memtest://``: a filesystem without directories, held in memory, as a bucket store.

Beam finds every ``FileSystem`` subclass by its scheme, so importing this module is
enough for ``FileSystems`` (and so for a whole dataset build) to reach these URIs.
Like an object store it has no folders: a "directory" is a prefix of file names, and
a rename is a copy that drops the original.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, ClassVar

from apache_beam.io.filesystem import FileMetadata, FileSystem


class MemoryFileSystem(FileSystem):
    files: ClassVar[dict[str, bytes]] = {}

    @classmethod
    def scheme(cls) -> str:
        return "memtest"

    def join(self, basepath: str, *paths: str) -> str:
        return "/".join([basepath.rstrip("/"), *(path.strip("/") for path in paths)])

    def split(self, path: str) -> tuple[str, str]:
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def create(self, path: str, mime_type: str = "", compression_type: Any = None) -> io.BytesIO:
        files = self.files

        class Upload(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    files[path] = self.getvalue()
                super().close()

        return Upload()

    def open(self, path: str, mime_type: str = "", compression_type: Any = None) -> io.BytesIO:
        if path not in self.files:
            raise FileNotFoundError(path)
        return io.BytesIO(self.files[path])

    def rename(self, sources: list[str], destinations: list[str]) -> None:
        for source, destination in zip(sources, destinations, strict=True):
            self.files[destination] = self.files.pop(source)

    def copy(self, sources: list[str], destinations: list[str]) -> None:
        for source, destination in zip(sources, destinations, strict=True):
            self.files[destination] = self.files[source]

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            self.files.pop(path, None)

    def exists(self, path: str) -> bool:
        return path in self.files

    def mkdirs(self, path: str) -> None:
        """Nothing to make: folders are prefixes."""

    def has_dirs(self) -> bool:
        return False

    def _list(self, dir_or_prefix: str) -> Iterator[FileMetadata]:
        for path, data in sorted(self.files.items()):
            if path.startswith(dir_or_prefix):
                yield FileMetadata(path, len(data), 0.0)

    def size(self, path: str) -> int:
        return len(self.files[path])

    def last_updated(self, path: str) -> float:
        return 0.0

    def checksum(self, path: str) -> str:
        return str(len(self.files[path]))

    def metadata(self, path: str) -> FileMetadata:
        return FileMetadata(path, len(self.files[path]), 0.0)
