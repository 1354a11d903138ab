"""Calibration on a full disk: the error names the sidecar and says the disk (or the quota) is
full, and the old sidecar stays as it was, with no temporary left beside it.

One test fakes the full disk (a file object that takes a few bytes, then fails as the kernel
does); another fills a real 30 MiB tmpfs where this process may mount one (root in a container),
and is skipped elsewhere."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import shutil
import subprocess

import pytest

from rapidmoe_gguf import atomic, cli
from rapidmoe_gguf.bundled import MODEL_DIR

FILES = ("tiny-moe.gguf", "tiny-moe.residual.gguf", "tiny-moe.heldout.txt")


def _copy_bundled(folder) -> str:
    for name in FILES:
        shutil.copy(os.path.join(MODEL_DIR, name), folder)
    return os.path.join(folder, FILES[0])


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _calibrate(model: str, capsys) -> tuple[int, str]:
    folder = os.path.dirname(model)
    rc = cli.main(["calibrate", model, "-f", os.path.join(folder, FILES[2]), "--tokens", "256", "-t", "1"])
    return rc, capsys.readouterr().err


def _assert_untouched(folder: str, sidecar_digest: str) -> None:
    assert _digest(os.path.join(folder, FILES[1])) == sidecar_digest
    assert sorted(os.listdir(folder)) == sorted(FILES)   # no .partial temporary left


class _SmallDisk(io.FileIO):
    """A file on a disk with ``room`` bytes left: writes what fits, then fails with ``err``."""

    def __init__(self, fd: int, room: int, err: int):
        super().__init__(fd, "wb")
        self.room, self.err = room, err

    def write(self, b) -> int:
        n = min(len(memoryview(b).cast("B")), self.room)
        if n == 0:
            raise OSError(self.err, os.strerror(self.err))
        self.room -= n
        return super().write(memoryview(b).cast("B")[:n])


@pytest.mark.parametrize("err, says", [(errno.ENOSPC, r"the disk holding .* is full \(.* MiB free there\)"),
                                       (errno.EDQUOT, r"the disk quota for .* is used up")])
def test_calibrate_on_full_disk_names_sidecar_and_keeps_it(tmp_path, monkeypatch, capsys, err, says):
    model = _copy_bundled(tmp_path)
    sidecar = os.path.join(tmp_path, FILES[1])
    before = _digest(sidecar)
    real = atomic.create_temp

    def small_disk(target):   # 1 MiB of room, less than the 12.8 MiB sidecar
        path, f = real(target)
        fd = os.dup(f.fileno())
        f.close()
        return path, io.BufferedWriter(_SmallDisk(fd, 1 << 20, err))

    monkeypatch.setattr(atomic, "create_temp", small_disk)
    rc, stderr = _calibrate(model, capsys)
    assert rc == 1
    assert stderr.startswith(f"error: cannot write {sidecar}: {os.strerror(err)}: "), stderr
    assert re.search(says + r"; it needs about 12\.8 MiB", stderr), stderr
    _assert_untouched(str(tmp_path), before)


def test_calibrate_full_disk_error_is_still_an_oserror(tmp_path, monkeypatch):
    """API callers that catch OSError keep catching it, with the errno."""
    from rapidmoe_gguf import evaluate, gguf_rewrite

    _copy_bundled(tmp_path)
    sidecar = os.path.join(tmp_path, FILES[1])
    def disk_full(src, dst, kv):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf_rewrite, "_copy_with_kv", disk_full)
    with pytest.raises(OSError) as info:
        evaluate.rewrite_with_kv(sidecar, {"x.y": 1})
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).startswith(f"cannot write {sidecar}: No space left on device")


@pytest.fixture
def tmpfs_30m(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not shutil.which("mount"):
        pytest.skip("no mount command")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_calibrate_on_real_full_tmpfs(tmpfs_30m, capsys):
    """The pair (23.8 MB) fits in 30 MiB; a second copy of the 13.4 MB sidecar does not."""
    model = _copy_bundled(tmpfs_30m)
    before = _digest(os.path.join(tmpfs_30m, FILES[1]))
    rc, stderr = _calibrate(model, capsys)
    assert rc == 1
    assert stderr.startswith(f"error: cannot write {tmpfs_30m / FILES[1]}: No space left on device: "
                             f"the disk holding {tmpfs_30m} is full"), stderr
    assert "requested and" not in stderr
    _assert_untouched(str(tmpfs_30m), before)
