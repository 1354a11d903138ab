#!/usr/bin/env python3
"""A model larger than the memory: our engine streaming its experts (``--ram-budget``) against
llama.cpp mapping the same file, both in a memory cgroup of --limit bytes, with the page cache
dropped before every run.

    python tools/bench_memory_limit.py MODEL.gguf --limit 1400MiB --runs 3 --threads 2 --rt

Each run is a fresh process put in a fresh memory cgroup (v1's memory controller or v2, whichever
this machine has; root needed, as for dropping the page cache), the engines alternating. It
reports decode tok/s (--decode tokens of a fixed random script after a --prompt-token prompt, after
a warm-up), prefill tok/s (one --prefill-token batch), the bytes the block device read during the
run per decoded token, the cgroup's peak memory and failcnt, and whether the run was killed.
For ours also the expert cache's hit rate and read-ahead accuracy (Model.expert_cache).

Copy it out of tools/ before running from a checkout (as bench_vs_llamacpp.py), so that its
worker imports the installed package."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_llamacpp as bvl  # noqa: E402

CGROUP_V1 = "/sys/fs/cgroup/memory"
CGROUP_V2 = "/sys/fs/cgroup"


class Cgroup:
    """A memory cgroup of `limit` bytes for one run; removed on exit."""

    def __init__(self, name: str, limit: int):
        self.v1 = os.path.isdir(CGROUP_V1)
        root = CGROUP_V1 if self.v1 else CGROUP_V2
        self.path = os.path.join(root, name)
        os.makedirs(self.path, exist_ok=True)
        self._write("memory.limit_in_bytes" if self.v1 else "memory.max", str(limit))
        if not self.v1:
            self._write("memory.swap.max", "0")

    def _write(self, name: str, text: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(text)

    def _read(self, name: str) -> str:
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read().strip()
        except OSError:
            return ""

    def peak(self) -> int:
        return int(self._read("memory.max_usage_in_bytes" if self.v1 else "memory.peak") or 0)

    def failcnt(self) -> int:
        if self.v1:
            return int(self._read("memory.failcnt") or 0)
        for line in self._read("memory.events").splitlines():
            if line.startswith("max "):
                return int(line.split()[1])
        return 0

    def enter_prefix(self) -> list[str]:
        """A command prefix that moves the process into the group, then runs the rest."""
        return ["sh", "-c", f'echo $$ > {os.path.join(self.path, "cgroup.procs")} && exec "$@"', "sh"]

    def remove(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def block_device_stat(path: str) -> str:
    """/sys/.../stat of the block device holding path (the whole disk for a partition)."""
    dev = os.stat(path).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    stat = os.path.join(base, "stat")
    return stat if os.path.exists(stat) else ""


def sectors_read(stat: str) -> int:
    if not stat:
        return 0
    with open(stat) as f:
        return int(f.read().split()[2])


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class DiskCount:
    """Counts the block device's reads over the decode (the engines' decode_started / _done)."""

    stat = ""

    def decode_started(self) -> None:
        super().decode_started()
        self._s0 = sectors_read(self.stat)

    def decode_done(self) -> None:
        super().decode_done()
        self.extra["decode_disk_bytes"] = (sectors_read(self.stat) - self._s0) * 512


class StreamedEngine(DiskCount, bvl.OursEngine):
    def __init__(self, path: str, threads: int, n_ctx: int, n_batch: int, ram_budget: str, prefetch: str,
                 policy: str | None = None, budget: str = "0.25"):
        import rapidmoe_gguf
        from rapidmoe_gguf import Model, kernels

        res = {"residual_policy": policy, "residual_budget": budget if budget == "auto" else float(budget)} \
            if policy else {"residual": None}
        self.m = Model(path, n_ctx=n_ctx, n_threads=threads, n_batch=n_batch, ram_budget=ram_budget, prefetch=prefetch,
                       **res)
        self.n_vocab = self.m.n_vocab
        self.extra = {"cpu_isa": kernels.cpu_isa(), "residual_policy": None,
                      "package": os.path.dirname(os.path.abspath(rapidmoe_gguf.__file__))}

    def decode_done(self) -> None:
        super().decode_done()
        self.extra["expert_cache"] = self.m.expert_cache
        if self.m.residual_path:
            self.extra["residual_rate"] = self.m.stats()["residual_rate"]
            self.extra["auto_budget"] = self.m.backend_stats()["auto_budget"]


class MappedEngine(DiskCount, bvl.LlamaEngine):
    pass


def worker(a) -> dict:
    """One engine's run (in its cgroup): bench_vs_llamacpp's measurements, with our engine streaming
    and the disk's reads over the decode counted."""
    DiskCount.stat = block_device_stat(a.model)
    bvl.OursEngine = lambda path, threads, n_ctx, n_batch, policy=None, budget=0.25: StreamedEngine(
        path, threads, n_ctx, n_batch, a.ram_budget, a.prefetch, a.residual_policy, a.residual_budget)
    bvl.LlamaEngine = MappedEngine
    return bvl.worker(a.worker, a.model, a.threads, a.prompt, a.decode, a.prefill, "script")


def run_one(engine: str, python: str, a, stat: str, k: int) -> dict:
    drop_page_cache()
    from rapidmoe_gguf.planner import parse_bytes   # the driver's environment has the package; a worker's need not

    cg = Cgroup(f"rapidmoe-bench-{os.getpid()}-{k}", parse_bytes(a.limit))
    try:
        cmd = cg.enter_prefix() + bvl.rt_prefix(a.rt) + [
            python, os.path.abspath(__file__), "--worker", engine, a.model, "--threads", str(a.threads),
            "--prompt", str(a.prompt), "--decode", str(a.decode), "--prefill", str(a.prefill),
            "--ram-budget", a.ram_budget, "--prefetch", a.prefetch,
            "--residual-budget", a.residual_budget] + (["--residual-policy", a.residual_policy] if a.residual_policy else [])
        s0 = sectors_read(stat)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=bvl.worker_env(engine, a.isa), timeout=3600)
        wall = time.perf_counter() - t0
        disk = (sectors_read(stat) - s0) * 512
        r = {"engine": engine, "exit": p.returncode, "wall_s": wall, "disk_bytes": disk,
             "cgroup_peak": cg.peak(), "cgroup_failcnt": cg.failcnt()}
        if p.returncode == 0:
            r.update(json.loads(p.stdout.strip().splitlines()[-1]))
        else:
            r["killed"] = p.returncode in (-9, 137)
            r["stderr"] = p.stderr[-2000:]
        return r
    finally:
        cg.remove()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--limit", default="1400MiB", help="the memory cgroup's limit (default: %(default)s)")
    ap.add_argument("--ram-budget", default="auto", help="ours: Model(ram_budget=...) (default: %(default)s)")
    ap.add_argument("--prefetch", default="known", help="ours: Model(prefetch=...) (default: %(default)s)")
    ap.add_argument("--residual-policy", help="ours: run MODEL with its RESplit sidecar under this policy "
                                              "(default: base only)")
    ap.add_argument("--residual-budget", default="0.25", help="with --residual-policy (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=64)
    ap.add_argument("--engines", default="ours,llama.cpp")
    ap.add_argument("--isa", default=None, help="ours: RAPIDMOE_ISA")
    ap.add_argument("--llama-isa", default="best")
    ap.add_argument("--rt", action="store_true", help="real-time priority (chrt -f 1)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", choices=["ours", "llama.cpp"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return 0
    engines = a.engines.split(",")
    pythons = {"ours": sys.executable, "llama.cpp": bvl.llama_python(bvl.default_venv(a.llama_isa))}
    stat = block_device_stat(a.model)
    size = os.path.getsize(a.model)
    print(f"{a.model}: {size / 2**30:.2f} GiB; cgroup limit {a.limit}; {a.threads} threads; "
          f"decode {a.decode} tokens after {a.prompt}, prefill {a.prefill}", flush=True)
    runs: list[dict] = []
    for k in range(a.runs):
        for e in engines if k % 2 == 0 else engines[::-1]:
            r = run_one(e, pythons[e], a, stat, len(runs))
            runs.append(r)
            line = f"  {e:10s} exit {r['exit']}"
            if r["exit"] == 0:
                line += (f"  decode {r['decode_tok_s']:7.2f} tok/s  prefill {r['prefill_tok_s']:7.2f} tok/s  "
                         f"disk {r['disk_bytes'] / 2**20:6.0f} MiB, {r['decode_disk_bytes'] / a.decode / 2**20:5.1f} "
                         f"MiB/decoded token  peak {r['cgroup_peak'] / 2**20:5.0f} MiB  failcnt {r['cgroup_failcnt']}")
                if "expert_cache" in r:
                    c = r["expert_cache"]
                    line += f"  hit {c['hit_rate']:.2f} ahead {c['prefetch_accuracy']:.2f}"
                if r.get("residual_rate") is not None:
                    line += f"  residual rate {r['residual_rate']:.3f} (auto budget {r['auto_budget']:.3f})"
            print(line, flush=True)
    table = {}
    for e in engines:
        ok = [r for r in runs if r["engine"] == e and r["exit"] == 0]
        table[e] = {"runs": len([r for r in runs if r["engine"] == e]), "ok": len(ok),
                    "decode_tok_s": statistics.median(r["decode_tok_s"] for r in ok) if ok else None,
                    "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in ok) if ok else None,
                    "disk_mib_per_run": statistics.median(r["disk_bytes"] for r in ok) / 2**20 if ok else None,
                    "disk_mib_per_decoded_token":
                        statistics.median(r["decode_disk_bytes"] for r in ok) / a.decode / 2**20 if ok else None}
    if all(table[e]["ok"] for e in engines) and len(engines) == 2:
        table["ratio"] = {k: table["ours"][k] / table["llama.cpp"][k] for k in ("decode_tok_s", "prefill_tok_s")}
    print(json.dumps(table, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "cpu": bvl.cpu_info(), "runs": runs, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
