"""Memory-map a file read-only without keeping its file descriptor open: a part file
(`map_open_file`) or an old layout's `.npy` column (`map_npy`).

`np.load(mmap_mode="r")` maps through Python's `mmap` module, which (before Python 3.13's
`trackfd=False`) keeps a duplicate descriptor open for as long as the map lives: a loader
holding every column of every part mapped then holds 28 descriptors per Criteo part and
ends in `OSError: [Errno 24] Too many open files` past ~35 parts under `ulimit -n 1024`
(measured with /proc/self/fd: one descriptor per np.load map). A map does not need its
descriptor once made, so here the file is opened, mapped with libc's mmap (PROT_READ,
MAP_SHARED: the same pages and read-ahead as numpy's map) and closed at once; the map is
unmapped when the last array viewing it is gone. Maps still count against the kernel's
per-process limit (vm.max_map_count), which format/part_cache.py keeps the loader under.

Elsewhere than Linux (no libc mmap through ctypes), this falls back to numpy's map.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import io
import math
import mmap
import os
import re
import struct
import sys
import weakref
from pathlib import Path

import numpy as np

_PROT_READ = getattr(mmap, "PROT_READ", 1)
_MAP_SHARED = getattr(mmap, "MAP_SHARED", 1)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.restype = ctypes.c_int
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


_LIBC = _libc()


# The header np.save writes for a plain dtype, e.g. {'descr': '<u2', 'fortran_order': False,
# 'shape': (450000,), }
_PLAIN_HEADER = re.compile(
    r"\{'descr': '([<>|=][a-z]\d+)', 'fortran_order': (True|False), 'shape': \(([\d, ]*)\), \} *\n?"
)
_LENGTH = {(1, 0): "<H", (2, 0): "<I"}


@functools.lru_cache(maxsize=256)
def _dtype(descr: str) -> np.dtype:
    return np.dtype(descr)


def _read_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of an open .npy file, left positioned at its data.

    np.save's own headers are read with one regular expression: numpy's reader compiles each
    header as Python (ast.literal_eval), which over Criteo 1TB's 280 K column files is minutes
    before the first batch. Any other header goes to numpy's reader."""
    version = np.lib.format.read_magic(f)
    if version not in _LENGTH:
        raise ValueError(f"npy format version {version} is not supported")
    start = f.tell()
    size_bytes = f.read(struct.calcsize(_LENGTH[version]))
    if len(size_bytes) == struct.calcsize(_LENGTH[version]):
        header = f.read(struct.unpack(_LENGTH[version], size_bytes)[0])
        plain = _PLAIN_HEADER.fullmatch(header.decode("latin1"))
        if plain is not None:
            shape = tuple(int(v) for v in plain[3].split(",") if v.strip())
            return shape, plain[2] == "True", _dtype(plain[1])
    f.seek(start)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


_HEAD_BYTES = 4096
"""Bytes read to find a header: np.save pads its headers to 64 bytes (128 for Criteo's columns)."""


@functools.lru_cache(maxsize=1024)
def _parse_head(head: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """(shape, fortran_order, dtype, data offset) of a .npy file's first bytes, or None when its
    header is not all in `head`. Cached by the header's bytes: the parts of a dataset repeat the
    same few headers (one per column of a part size), ~10,000 times each at Criteo 1TB."""
    f = io.BytesIO(head)
    shape, fortran, dtype = _read_header(f)
    return shape, fortran, dtype, f.tell()


def _header_of(fd: int, path: str | Path) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """The header of the open file `fd`: one pread, parsed once per distinct header."""
    head = os.pread(fd, _HEAD_BYTES, 0)
    try:
        version = head[6:8]  # after the 6-byte magic: the header length's size depends on it
        size = struct.calcsize(_LENGTH[(version[0], version[1])]) if len(version) == 2 else 0
        length = struct.unpack(_LENGTH[(version[0], version[1])], head[8 : 8 + size])[0]
    except (KeyError, IndexError, struct.error):  # not a .npy header, or a file of under 8 bytes
        length = None
    if length is not None and 8 + size + length <= len(head):
        return _parse_head(head[: 8 + size + length])
    with open(path, "rb") as f:  # a bad magic (numpy's own message) or a header longer than `head`
        shape, fortran, dtype = _read_header(f)
        return shape, fortran, dtype, f.tell()


def map_npy(path: str | Path) -> np.ndarray:
    """A read-only array over the file's data, memory-mapped, holding no file descriptor.

    Raises:
        ValueError: not a .npy file numpy could map (bad magic or header, object dtype,
            fewer bytes than its header says).
        OSError: the file cannot be opened or mapped (errno EMFILE: open-file limit;
            ENOMEM: the map limit, vm.max_map_count).
    """
    if _LIBC is None:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    # os.open/pread/fstat, not a buffered file object: a Criteo part opens 28 files, ~10,000 parts
    # per epoch, on the thread that warms the next shuffle group beside the gathers.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        shape, fortran, dtype, offset = _header_of(fd, path)
        if dtype.hasobject:
            raise ValueError("object arrays cannot be memory-mapped")
        size = os.fstat(fd).st_size
        nbytes = math.prod(shape) * dtype.itemsize  # np.prod: ~40 us a call, 20% of a map
        if offset + nbytes > size:
            raise ValueError(
                f"the header promises {nbytes} bytes of data, the file holds {size - offset}"
            )
        if nbytes == 0:
            return _read_only(np.empty(shape, dtype, order="F" if fortran else "C"))
        address = _LIBC.mmap(None, offset + nbytes, _PROT_READ, _MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)
    # The ctypes buffer owns the map: numpy keeps it as the base of every view, and the map
    # goes when the last view does (after the descriptor was closed above).
    buffer = (ctypes.c_uint8 * (offset + nbytes)).from_address(address)
    weakref.finalize(buffer, _LIBC.munmap, address, offset + nbytes)
    array = np.ndarray(shape, dtype, buffer=buffer, offset=offset, order="F" if fortran else "C")
    return _read_only(array)


def map_open_file(fd: int, size: int, path: str | Path) -> np.ndarray:
    """A read-only uint8 array over the first `size` bytes of the open file `fd`, memory-mapped.
    The map does not need `fd`: close it at once (it goes when the last view of the array does).

    Raises:
        OSError: the map failed (errno ENOMEM: the map limit, vm.max_map_count).
    """
    if size == 0:
        return _read_only(np.empty(0, np.uint8))
    if _LIBC is None:
        return np.asarray(np.memmap(path, np.uint8, "r", shape=(size,)))
    address = _LIBC.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))
    buffer = (ctypes.c_uint8 * size).from_address(address)
    weakref.finalize(buffer, _LIBC.munmap, address, size)
    return _read_only(np.frombuffer(buffer, np.uint8))


_MADV_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)
_PAGE = mmap.PAGESIZE


def read_ahead_spans(spans: list[tuple[int, int]], probe: bool = False) -> bool:
    """Start reading spans (address, bytes) of maps into the page cache (MADV_WILLNEED), without
    waiting for them and without mapping them into the process; whether it asked. With `probe`,
    not where the page cache holds them already.

    The loader calls it on a background thread for each part's rows the next shuffle group will
    read, so that a dataset on disk is read ahead of the gathers. Mapping the pages as well
    (MADV_POPULATE_READ) took the gathers' minor faults away but counted the next group's
    pages in the RSS (+4 GB at 10,000 Criteo parts) for no measurable rate. Asking for pages
    the cache holds is not free either (~5-7 us a column span, a walk of the cache: ~50 ms of
    CPU per shuffle group of 256 Criteo parts), so with `probe` the middle pages of three spans
    (a quarter, half and three quarters down the list) are looked up first (mincore, ~2 us each):
    where all three are cached, so are taken to be the others, read together when their part was
    last read (a page the cache dropped meanwhile is read when a gather faults on it: slower,
    never wrong). From five spans on, that leaves out the first and the last: opening a part
    reads its header and footer, and the kernel's read-around may bring their neighbours in.
    `probe` only where mincore tells the truth: since Linux 5.0 it says "all cached" of a file
    the process neither owns nor may write (part_file.Part.residency_known). The ctypes calls
    release the GIL."""
    spans = [(a, n) for a, n in spans if n > 0]
    if _LIBC is None or not spans:
        return False
    probes = {len(spans) // 4, len(spans) // 2, 3 * len(spans) // 4}
    if probe and all(_cached(spans[k][0] + spans[k][1] // 2) for k in probes):
        return False
    for address, length in spans:
        aligned = address - address % _PAGE
        _LIBC.madvise(aligned, length + address - aligned, _MADV_WILLNEED)
    return True


def _cached(address: int) -> bool:
    """Whether the page of a map holding `address` is in the page cache (mincore's low bit)."""
    vec = ctypes.c_ubyte(0)
    aligned = address - address % _PAGE
    return _LIBC.mincore(aligned, 1, ctypes.byref(vec)) == 0 and bool(vec.value & 1)


def _read_only(array: np.ndarray) -> np.ndarray:
    # PROT_READ pages: a write would crash the process, so numpy must refuse it first.
    array.flags.writeable = False
    return array


def limit_message(error: OSError) -> str | None:
    """The one line saying which process limit an open or map ran into, or None for other errors."""
    if error.errno == errno.EMFILE:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return f"the open-file limit is reached (ulimit -n {soft}); raise it, e.g. `ulimit -n 4096`"
    if error.errno == errno.ENOMEM:
        return "the kernel refused another memory map (its per-process limit vm.max_map_count, or memory)"
    return None
