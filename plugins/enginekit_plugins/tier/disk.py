"""``disk``: KV blocks in files on a local filesystem, least recently used evicted first.

One file per key, ``<disk_path>/<namespace>/<key as 16 hex digits>.kvb``, rather than one
large memory-mapped file of slots: a block is written to a temporary name and renamed into
place, so no reader ever sees half a block and a crash leaves whole files or none; an
evicted block's file is deleted, which gives its room back to the filesystem at once; a
corrupt block spoils one file, never a neighbour; and no slot allocator has to be kept
consistent with the index. A block is megabytes for a real model, so the cost of one
open per block is small beside the bytes moved.

Each file is a header then the payload's bytes. The header holds a magic number, the
block's key, the payload's length and its XXH3-64 checksum (xxhash, 15 GB/s: a checksum
that keeps up with an NVMe drive), so a missing, truncated, renamed or corrupted file is
recognised when it is read: the load stops there as a miss, the key is dropped and the
failure counted, and the block is computed again. Never are wrong bytes returned.

The index of what the folder holds, in least-recently-used order, is kept in memory
(``LruIndex``), at most ``tier.disk_gib`` of blocks. Files a previous engine left in the
namespace's folder are taken into the index at construction, oldest first (their
checksums are checked when they are loaded). What the level evicts it reads back (checked)
before it deletes the file, for the next level down.

In the simulator (``moves_data`` False) the level writes no files and probes no folder:
it keeps its index alone, and the drive it models is ``tier.disk_gib`` large.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import xxhash

from enginekit.config import TierConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.tier import KVTier, LruIndex, Payload, TierContext

BYTES_PER_GIB = 1 << 30
KEY_MASK = (1 << 64) - 1
SUFFIX = ".kvb"
MAGIC = b"EKVB"
VERSION = 1
# magic, format version, key, payload length, XXH3-64 of the payload
HEADER = struct.Struct("<4sIQQQ")


@dataclass
class DiskTierConfig(TierConfig):
    name: str = "disk"


def file_name(key: int) -> str:
    """The file of ``key`` (a 64-bit content hash) inside the namespace's folder."""
    return f"{key & KEY_MASK:016x}{SUFFIX}"


def encode_header(key: int, payload: memoryview) -> bytes:
    digest = xxhash.xxh3_64_intdigest(payload)
    return HEADER.pack(MAGIC, VERSION, key & KEY_MASK, payload.nbytes, digest)


def _byte_view(payload: Payload) -> memoryview:
    """``payload``'s bytes as a flat byte view (no copy). Raises TypeError without the
    buffer protocol, ValueError for a buffer that is not contiguous."""
    view = memoryview(payload)
    if not view.c_contiguous:
        raise ValueError("a payload must be a C-contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class DiskTier(KVTier):
    """``tier.disk_gib`` of block files under ``tier.disk_path`` (None: a fresh folder of
    its own under the system's temp folder, removed by ``close``), in a subfolder per
    namespace. Refused up front (ConfigError): a size <= 0 or larger than the free space
    of the folder's filesystem, a folder that cannot be created or written, a speed <= 0.
    ``bytes_per_s``: the drive's (``tier.disk_gb_per_s``), at most the host link's."""

    Config = DiskTierConfig

    def __init__(self, config: TierConfig, context: TierContext) -> None:
        super().__init__(config, context)
        if config.disk_gib <= 0:
            raise ConfigError(f"tier.disk_gib must be > 0, got {config.disk_gib}")
        if config.disk_gb_per_s <= 0:
            raise ConfigError(f"tier.disk_gb_per_s must be > 0, got {config.disk_gb_per_s}")
        num_bytes = int(config.disk_gib * BYTES_PER_GIB)
        capacity = num_bytes // context.block_bytes
        if capacity < 1:
            raise ConfigError(
                f"tier.disk_gib={config.disk_gib:g} holds no block of {context.block_bytes} bytes"
            )
        self._index = LruIndex(capacity)
        self._owned_root: Path | None = None
        self.folder: Path | None = None
        if not context.moves_data:
            return
        if config.disk_path is None:
            root = Path(tempfile.mkdtemp(prefix="enginekit-kv-tier-"))
            self._owned_root = root
            # removed on close(), or when the level is collected or the process exits
            self._cleanup = weakref.finalize(self, shutil.rmtree, root, ignore_errors=True)
        else:
            root = Path(config.disk_path).expanduser()
        try:
            self.folder = _writable_folder(root / context.namespace)
            free = shutil.disk_usage(self.folder).free
            if num_bytes > free:
                raise ConfigError(
                    f"tier.disk_gib={config.disk_gib:g} is more than the free space of "
                    f"{root} ({free / BYTES_PER_GIB:.1f} GiB free)"
                )
        except ConfigError:
            self.close()
            raise
        self._adopt_files()

    # -- the contract -----------------------------------------------------------------------

    @property
    def capacity_blocks(self) -> int:
        return self._index.capacity

    @property
    def bytes_per_s(self) -> float:
        return min(self.config.disk_gb_per_s * 1e9, self.context.link_bytes_per_s)

    def num_blocks(self) -> int:
        return len(self._index)

    def num_present(self, keys: Sequence[int]) -> int:
        return self._index.num_leading(keys)

    def load(self, keys: Sequence[int]) -> list[Payload]:
        index = self._index
        payloads: list[Payload] = []
        for key in keys:
            if key not in index:
                break
            if self.folder is None:  # the simulator: an index only
                index.get(key)
                payloads.append(None)
                continue
            payload = self._read(key)
            if payload is None:
                self.num_failures += 1
                index.pop(key)
                self._unlink(key)
                break
            index.get(key)
            payloads.append(payload)
        return payloads

    def store(self, key: int, payload: Payload) -> list[tuple[int, Payload]]:
        index = self._index
        if key in index:  # a key names its content: the file holds these bytes already
            index.get(key)
            return []
        if self.folder is not None and not self._write(key, payload):
            self.num_failures += 1
            return []
        evicted = list(index.put(key, None))
        if self.folder is None:
            return evicted
        handed_down: list[tuple[int, Payload]] = []
        for evicted_key, _ in evicted:
            data = self._read(evicted_key)
            self._unlink(evicted_key)
            if data is not None:
                handed_down.append((evicted_key, data))
        return handed_down

    def touch(self, key: int) -> None:
        self._index.touch(key)

    def discard(self, keys: Sequence[int]) -> None:
        for key in keys:
            if key in self._index:
                self._index.pop(key)
                if self.folder is not None:  # None: the simulator's disk, an index alone
                    self._unlink(key)

    def check_integrity(self) -> None:
        self._index.check_integrity()

    def close(self) -> None:
        """Removes the folder if the level made it (``tier.disk_path`` unset); a folder of
        the user's keeps its files, for the next engine of the same namespace."""
        if self._owned_root is not None:
            self._cleanup()

    # -- files ------------------------------------------------------------------------------

    def _path(self, key: int) -> Path:
        assert self.folder is not None
        return self.folder / file_name(key)

    def _write(self, key: int, payload: Payload) -> bool:
        """Writes ``payload`` to ``key``'s file (a temporary file renamed into place);
        False, leaving no file behind, if it cannot."""
        if payload is None:
            return False
        path = self._path(key)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            view = _byte_view(payload)
            header = encode_header(key, view)
            with open(temporary, "wb") as out:
                out.write(header)
                out.write(view)
            os.replace(temporary, path)
        except (OSError, TypeError, ValueError):
            with contextlib.suppress(OSError):
                temporary.unlink()
            return False
        return True

    def _read(self, key: int) -> bytearray | None:
        """``key``'s payload if its file is whole and its checksum matches; None for a
        missing, unreadable, truncated, overlong or corrupted file."""
        try:
            with open(self._path(key), "rb") as source:
                header = source.read(HEADER.size)
                if len(header) != HEADER.size:
                    return None
                magic, version, stored_key, length, digest = HEADER.unpack(header)
                if (magic, version, stored_key) != (MAGIC, VERSION, key & KEY_MASK):
                    return None
                payload = bytearray(length)
                if source.readinto(payload) != length or source.read(1):
                    return None
        except (OSError, MemoryError):
            return None
        if xxhash.xxh3_64_intdigest(payload) != digest:
            return None
        return payload

    def _unlink(self, key: int) -> None:
        with contextlib.suppress(OSError):
            self._path(key).unlink()

    def _adopt_files(self) -> None:
        """Indexes the block files already in the folder, oldest first, deleting those
        beyond the capacity."""
        assert self.folder is not None
        found: list[tuple[float, int]] = []
        for entry in os.scandir(self.folder):
            name = entry.name
            stem = name.removesuffix(SUFFIX)
            if name == stem or len(stem) != 16:
                continue
            try:
                found.append((entry.stat().st_mtime, int(stem, 16)))
            except (OSError, ValueError):
                continue
        for _, key in sorted(found):
            for evicted_key, _ in self._index.put(key, None):
                self._unlink(evicted_key)


def _writable_folder(folder: Path) -> Path:
    """``folder``, created if need be, once a probe file could be written to it and
    removed. Raises ConfigError naming ``tier.disk_path`` and the reason otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-", suffix=".tmp") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"tier.disk_path: cannot write block files in {folder} ({reason})"
        ) from None
    return folder
