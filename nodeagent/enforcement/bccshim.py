"""Make Debian's BCC usable from the project venv (design §4 "Enforcement"; see shared/STACK.md).

Two problems, two small fixes:

1. BCC's Python bindings (Debian ``python3-bpfcc``) live in ``/usr/lib/python3/dist-packages/bcc``, outside the
   venv. Putting all of dist-packages on ``sys.path`` would shadow the venv's own packages, so we add a folder
   that holds nothing but a ``bcc`` symlink. (The PyPI package named ``bcc`` is unrelated; never install it.)
2. BCC compiles C at run time and needs kernel headers, which this kernel does not ship. Debian's
   ``linux-headers-*-common`` and ``linux-headers-*-amd64`` are each incomplete alone, so we merge them into
   one tree of symlinks (``cp -rs``) under the cache dir and point ``BCC_KERNEL_SOURCE`` at it.
"""

from __future__ import annotations

import importlib
import logging
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

DEBIAN_BCC = Path("/usr/lib/python3/dist-packages/bcc")
HEADERS_ROOT = Path("/usr/src")


class BccUnavailableError(RuntimeError):
    """BCC cannot be imported or cannot find kernel headers; the message says why."""


def cache_dir() -> Path:
    """``$RECLAIMNET_CACHE_DIR``, else ``$XDG_CACHE_HOME/reclaimnet``, else ``~/.cache/reclaimnet``."""
    env = os.environ.get("RECLAIMNET_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reclaimnet"


def ensure_kernel_headers(cache: Path | None = None) -> Path | None:
    """Set ``BCC_KERNEL_SOURCE`` to a usable header tree, building the merged one if needed.

    Returns the tree used, or None when the running kernel ships its own (``/lib/modules/$(uname -r)/build``).
    """
    current = os.environ.get("BCC_KERNEL_SOURCE")
    if current and (Path(current) / "include" / "generated" / "autoconf.h").exists():
        return Path(current)
    if (Path("/lib/modules") / platform.release() / "build" / "include").exists():
        return None
    commons = sorted(HEADERS_ROOT.glob("linux-headers-*-common"))
    arches = sorted(p for p in HEADERS_ROOT.glob("linux-headers-*") if p not in commons)
    if not commons or not arches:
        raise BccUnavailableError(
            "no kernel headers: install linux-headers-amd64 (scripts/install_kernel_deps.sh)"
        )
    common, arch = commons[-1], arches[-1]
    merged = (cache or cache_dir()) / f"kernel-headers-{arch.name}"
    if not (merged / "include" / "generated" / "autoconf.h").exists():
        # Build beside the final place and rename, so a crash never leaves a half-merged tree behind.
        tmp = merged.with_name(merged.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        subprocess.run(["cp", "-rs", f"{common}/.", f"{tmp}/"], check=True)
        subprocess.run(["cp", "-rsf", f"{arch}/.", f"{tmp}/"], check=True)
        try:
            tmp.rename(merged)
            log.info("merged kernel headers %s + %s into %s", common, arch, merged)
        except OSError:
            # Another process finished the same tree first (or a broken one is in the way).
            shutil.rmtree(tmp, ignore_errors=True)
            if not (merged / "include" / "generated" / "autoconf.h").exists():
                raise
    os.environ["BCC_KERNEL_SOURCE"] = str(merged)
    return merged


def _checked(module: ModuleType) -> ModuleType:
    """Refuse a ``bcc`` that is not the BPF Compiler Collection (the unrelated PyPI package has that name)."""
    if not hasattr(module, "BPF"):
        raise BccUnavailableError(
            f"'bcc' at {getattr(module, '__file__', '?')} is not the BPF Compiler Collection; "
            "remove it (pip uninstall bcc) and install Debian's python3-bpfcc"
        )
    return module


def import_bcc(cache: Path | None = None) -> ModuleType:
    """Import ``bcc``, via a one-symlink shim folder if it is not importable already."""
    try:
        return _checked(importlib.import_module("bcc"))
    except ImportError:
        pass
    if not DEBIAN_BCC.is_dir():
        raise BccUnavailableError(
            f"{DEBIAN_BCC} missing: install python3-bpfcc (scripts/install_kernel_deps.sh)"
        )
    shim = (cache or cache_dir()) / "bcc-shim"
    link = shim / "bcc"
    shim.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink() or Path(os.readlink(link)) != DEBIAN_BCC:
        tmp = shim / f"bcc.tmp{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(DEBIAN_BCC)
        tmp.replace(link)
    if str(shim) not in sys.path:
        sys.path.append(str(shim))
    try:
        return _checked(importlib.import_module("bcc"))
    except BccUnavailableError:
        raise
    except Exception as exc:  # a missing libbcc.so raises OSError from ctypes
        raise BccUnavailableError(f"cannot import Debian's bcc: {exc}") from exc


def load_bcc() -> ModuleType:
    """Headers + import, the two steps every BPF backend needs."""
    ensure_kernel_headers()
    return import_bcc()
