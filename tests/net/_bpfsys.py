"""Just enough of the bpf() system call to ask whether a BPF map or program still exists (teardown tests)."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import platform
import time

_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
BPF_PROG_GET_FD_BY_ID = 13
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


class _Attr(ct.Structure):
    _fields_ = [("a", ct.c_uint32), ("b", ct.c_uint32), ("c", ct.c_uint64), ("pad", ct.c_uint8 * 112)]


def _bpf(cmd: int, attr: _Attr) -> int:
    ret = _libc.syscall(_SYS_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        raise OSError(ct.get_errno(), os.strerror(ct.get_errno()))
    return int(ret)


def obj_id(fd: int) -> int:
    """Kernel id of the BPF map or program behind ``fd`` (bpf_map_info and bpf_prog_info both start with
    type, id)."""
    info = (ct.c_uint32 * 32)()
    attr = _Attr()
    attr.a = fd
    attr.b = ct.sizeof(info)
    attr.c = ct.addressof(info)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return int(info[1])


def exists(kind: str, ident: int) -> bool:
    """Whether the map/prog with this id is still alive in the kernel."""
    attr = _Attr()
    attr.a = ident
    try:
        fd = _bpf(BPF_MAP_GET_FD_BY_ID if kind == "map" else BPF_PROG_GET_FD_BY_ID, attr)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    os.close(fd)
    return True


def wait_gone(objs: list[tuple[str, int]], timeout_s: float = 5.0) -> list[tuple[str, int]]:
    """Wait for the kernel to free the objects (it does so after an RCU grace period); return survivors."""
    deadline = time.monotonic() + timeout_s
    alive = list(objs)
    while alive and time.monotonic() < deadline:
        alive = [o for o in alive if exists(*o)]
        if alive:
            time.sleep(0.05)
    return alive
