"""TFRecord files written without TensorFlow.

A dataset build writes its shards in Beam workers, which must not import TensorFlow
(about 0.6 GiB per worker process) for a framing this small. Each record is

    uint64 length, little-endian
    uint32 masked CRC-32C of the length bytes
    the record's bytes
    uint32 masked CRC-32C of the record's bytes

with TensorFlow's mask ``((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32``. A gzip
shard is that stream as one gzip member, compressed as TensorFlow's ``GZIP`` option
does (zlib's default level, memory level 9): the gzip header carries no time or name,
so a rebuild writes identical bytes, and they are the bytes ``tf.io.TFRecordWriter``
writes. The writer digests what it writes, so a shard on a remote filesystem need not
be read back for its manifest entry; the reader digests what it reads, so checking a
remote shard against its manifest entry reads it once.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import zlib
from collections.abc import Iterator
from types import TracebackType
from typing import IO

import google_crc32c

COMPRESSIONS = ("none", "gzip")

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_GZIP_WINDOW_BITS = zlib.MAX_WBITS | 16  # a gzip header and trailer around the deflate data
_TF_MEM_LEVEL = 9  # TensorFlow's ZlibCompressionOptions default (zlib's own is 8)
_CHUNK = 1 << 20  # bytes gathered before each write, so small records cost no call each


def masked_crc32c(data: bytes) -> int:
    """CRC-32C as TFRecord stores it, masked so a CRC of CRC-bearing data stays strong."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as it appears in an uncompressed TFRecord file."""
    length = _LENGTH.pack(len(record))
    return b"".join(
        (length, _CRC.pack(masked_crc32c(length)), record, _CRC.pack(masked_crc32c(record)))
    )


class TFRecordWriter:
    """Writes framed records to a binary stream, which the caller opens and closes.

    ``close`` (or leaving the ``with`` block without an error) finishes the file:
    it writes the gzip trailer and what is still buffered, after which ``num_records``,
    ``num_bytes`` and ``sha256`` describe the bytes written.
    """

    def __init__(self, out: IO[bytes], compression: str) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
        self._out = out
        self._compressor = (
            zlib.compressobj(
                zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, _GZIP_WINDOW_BITS, _TF_MEM_LEVEL
            )
            if compression == "gzip"
            else None
        )
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._digest = hashlib.sha256()
        self.num_records = 0
        self.num_bytes = 0

    def write(self, record: bytes) -> None:
        framed = frame(record)
        self._buffer(self._compressor.compress(framed) if self._compressor else framed)
        self.num_records += 1

    def close(self) -> None:
        if self._compressor is not None:
            self._buffer(self._compressor.flush())
            self._compressor = None
        self._flush()

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:  # a failed file is abandoned by its caller, not finished
            self.close()

    def _buffer(self, data: bytes) -> None:
        if data:
            self._pending.append(data)
            self._pending_bytes += len(data)
            if self._pending_bytes >= _CHUNK:
                self._flush()

    def _flush(self) -> None:
        chunk = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        if chunk:
            self._out.write(chunk)
            self._digest.update(chunk)
            self.num_bytes += len(chunk)


class CorruptRecordError(ValueError):
    """A TFRecord stream that breaks off or fails a checksum: records before it are sound."""


class DigestingReader:
    """A binary stream's bytes, read on, counted and digested (SHA-256) on the way."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._digest = hashlib.sha256()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._digest.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> None:
        """Read to the end, so ``num_bytes`` and ``sha256`` cover the whole stream."""
        while self.read(_CHUNK):
            pass

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


def read_records(stream: IO[bytes] | DigestingReader, compression: str) -> Iterator[bytes]:
    """Every record of a TFRecord stream, each checked against its checksums, as
    TensorFlow's reader checks them; ``CorruptRecordError`` where the stream breaks."""
    if compression == "gzip":
        stream = gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[arg-type]
    try:
        while header := stream.read(_LENGTH.size + _CRC.size):
            if len(header) < _LENGTH.size + _CRC.size:
                raise CorruptRecordError("truncated record at the end of the file")
            length_bytes, (length_crc,) = (
                header[: _LENGTH.size],
                _CRC.unpack(header[_LENGTH.size :]),
            )
            if masked_crc32c(length_bytes) != length_crc:
                raise CorruptRecordError("corrupted record: its length fails its checksum")
            (length,) = _LENGTH.unpack(length_bytes)
            record = stream.read(length)
            footer = stream.read(_CRC.size)
            if len(record) < length or len(footer) < _CRC.size:
                raise CorruptRecordError("truncated record at the end of the file")
            if masked_crc32c(record) != _CRC.unpack(footer)[0]:
                raise CorruptRecordError("corrupted record: its data fails its checksum")
            yield record
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # gzip: a cut or damaged member
        raise CorruptRecordError(f"unreadable gzip stream: {exc}") from None
