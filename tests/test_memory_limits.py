"""RM_LOAD_AUTO reads a file whole only when it fits in three quarters of the memory available,
and in a container that is the memory cgroup's room (its limit less its use), not the host's
MemAvailable: a file read past the limit gets the process OOM-killed. Files that fit in the room
but not in three quarters of it are mapped; files larger than the room are streamed (the experts
read on demand into a cache of three quarters of the room: test_stream.py), or mapped where
even that cache would not hold one token's experts.

$RAPIDMOE_CGROUP_ROOT (a testing hook, default /sys/fs/cgroup) points the loader at fake cgroup
folders here. Whether a file was read or mapped shows in /proc/self/maps: each case is compared
with the same model loaded with use_mmap=True and use_mmap=False."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.bundled import MODEL_DIR

MIB = 1 << 20
FILES = ("tiny-moe.gguf", "tiny-moe.residual.gguf")   # 10.5 MB and 13.4 MB: more than 3/4 of 8 MiB


def _thp_usable() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(sys.platform != "linux" or not _thp_usable(),
                                reason="RM_LOAD_AUTO reads only on Linux with transparent huge pages")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A copy of the bundled pair under a path nothing else maps."""
    d = tmp_path_factory.mktemp("memlimit")
    for name in FILES:
        shutil.copy(os.path.join(MODEL_DIR, name), d)
    return str(d / FILES[0])


def _mappings(model: str, **kw) -> tuple[int, ...] | str:
    """How many regions of /proc/self/maps map each file of the pair while the model is loaded;
    "streamed" when its experts are streamed (its mappings then split around the resident parts)."""
    with rm.Model(model, n_ctx=64, n_threads=1, **kw) as m:
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
        if m.expert_cache["streaming"]:
            return "streamed"
    folder = os.path.dirname(model)
    return tuple(sum(line.endswith(" " + os.path.join(folder, n)) for line in maps) for n in FILES)


@pytest.fixture(scope="module")
def signatures(model) -> dict[str, tuple[int, ...]]:
    return {"mapped": _mappings(model, use_mmap=True), "read": _mappings(model, use_mmap=False)}


def _auto_load(model: str, root, monkeypatch) -> tuple[int, ...]:
    monkeypatch.setenv("RAPIDMOE_CGROUP_ROOT", str(root))
    monkeypatch.delenv("RAPIDMOE_MMAP", raising=False)
    return _mappings(model)


def _write(folder, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def _own_cgroup(hierarchy: str) -> str | None:
    """This process's cgroup path in /proc/self/cgroup: hierarchy "" for v2's "0::" line,
    "memory" for v1's memory controller; None without that line."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (hierarchy in controllers.split(",")) if hierarchy else controllers == "":
                return path
    return None


def test_signatures_differ(signatures):
    assert signatures["mapped"] != signatures["read"], signatures


@pytest.mark.parametrize("files", [
    {"memory_max": "max", "memory_current": str(100 * MIB)},           # v2, no limit
    {"memory_max": str(64 << 30), "memory_current": str(1 << 30)},     # v2, room to spare
    {"memory_max": str(1 << 30), "memory_current": str(1 << 30),       # v2, full of reclaimable cache
     "memory_stat": f"anon 0\nfile {1 << 30}\ninactive_file {512 * MIB}"},
], ids=["v2-max", "v2-roomy", "v2-cache"])
def test_auto_reads_when_the_cgroup_has_room(model, signatures, tmp_path, monkeypatch, files):
    _write(tmp_path, **files)
    assert _auto_load(model, tmp_path, monkeypatch) == signatures["read"]


@pytest.mark.parametrize("files", [
    {"memory_max": str(8 * MIB), "memory_current": "0"},                 # v2: a limit below the pair's 24 MB
    {"memory_max": str(1 << 30), "memory_current": str((1 << 30) - 8 * MIB)},   # v2: a large limit, mostly used
], ids=["v2-small-limit", "v2-used-up"])
def test_auto_streams_when_the_files_exceed_the_cgroup_room(model, signatures, tmp_path, monkeypatch, files):
    _write(tmp_path, **files)
    assert _auto_load(model, tmp_path, monkeypatch) == "streamed"


@pytest.mark.parametrize("files", [
    {"memory_max": str(1 << 30), "memory_current": str(2 << 30)},        # v2: over the limit (usage races)
], ids=["v2-over"])
def test_auto_maps_when_the_cgroup_lacks_room(model, signatures, tmp_path, monkeypatch, files):
    """With no room at all not even a stream's cache fits, and the mapping is what is left."""
    _write(tmp_path, **files)
    assert _auto_load(model, tmp_path, monkeypatch) == signatures["mapped"]


def test_auto_reads_under_a_v1_cgroup_without_limit(model, signatures, tmp_path, monkeypatch):
    # cgroup v1 says "no limit" with the largest page-aligned 63-bit number
    _write(tmp_path / "memory", memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes=str(100 * MIB))
    assert _auto_load(model, tmp_path, monkeypatch) == signatures["read"]


def test_auto_streams_under_a_small_v1_cgroup(model, signatures, tmp_path, monkeypatch):
    _write(tmp_path / "memory", memory_limit_in_bytes=str(8 * MIB), memory_usage_in_bytes="0")
    assert _auto_load(model, tmp_path, monkeypatch) == "streamed"


@pytest.mark.parametrize("hierarchy", ["", "memory"], ids=["v2", "v1"])
def test_a_limit_on_a_parent_cgroup_counts(model, signatures, tmp_path, monkeypatch, hierarchy):
    """The process's own cgroup has no limit; its parent's applies to it all the same."""
    path = _own_cgroup(hierarchy)
    if path is None or path.strip("/") == "":
        pytest.skip(f"this process sits in the root of its cgroup {hierarchy or 'v2'} hierarchy")
    base = tmp_path / "memory" if hierarchy else tmp_path
    own, parent = base / path.strip("/"), (base / path.strip("/")).parent
    if hierarchy:
        _write(own, memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes="0")
        _write(parent, memory_limit_in_bytes=str(8 * MIB), memory_usage_in_bytes="0")
    else:
        _write(own, memory_max="max", memory_current="0")
        _write(parent, memory_max=str(8 * MIB), memory_current="0")
    assert _auto_load(model, tmp_path, monkeypatch) == "streamed"
