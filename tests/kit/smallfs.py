"""A small filesystem that fills: a ``tmpfs`` mounted on a test's directory, grown later.

Mounting needs root (CAP_SYS_ADMIN): :func:`mount_allowed` tells whether this
machine lets the tests do it; a test that needs it skips without it
(:func:`tests.kit.guards.need`: on CI it fails instead).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["SmallFs", "mount_allowed", "small_fs"]

_allowed: list[bool] = []


def _mount(directory: Path, size: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )


def mount_allowed() -> bool:
    """Whether a tmpfs can be mounted here (tried once)."""
    if not _allowed:
        ok = os.geteuid() == 0 and shutil.which("mount") is not None
        if ok:
            probe = Path(tempfile.mkdtemp(prefix="lr-mount-probe-"))
            ok = _mount(probe, "1m").returncode == 0
            if ok:
                subprocess.run(["umount", str(probe)], capture_output=True)
            probe.rmdir()
        _allowed.append(ok)
    return _allowed[0]


class SmallFs:
    """A mounted tmpfs of a given size at :attr:`path`."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size

    def resize(self, size: str) -> None:
        """Grow (space returns) or shrink it, its files kept."""
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)
        self.size = size

    def used_bytes(self) -> int:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


@contextmanager
def small_fs(size: str, parent: Path | None = None) -> Iterator[SmallFs]:
    """A tmpfs of ``size`` (``"1m"``) on a new directory (world-writable: the PostgreSQL
    server, run as ``postgres``, may keep a tablespace there); unmounted at the end."""
    path = Path(tempfile.mkdtemp(prefix="lr-smallfs-", dir=parent))
    os.chmod(path, 0o755)
    out = _mount(path, size)
    if out.returncode != 0:
        path.rmdir()
        raise RuntimeError(f"mount tmpfs: {out.stderr}")
    try:
        yield SmallFs(path, size)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        path.rmdir()
