#!/usr/bin/env python3
"""Decode and prefill speed, and memory, of rapidmoe against llama.cpp on the same GGUF file.

    python tools/bench_vs_llamacpp.py MODEL.gguf [--threads 2] [--runs 5] [--json out.json] [--rt]
    python tools/bench_vs_llamacpp.py --install-only        # just build llama-cpp-python
    python tools/bench_vs_llamacpp.py MODEL.gguf --isa avx2  # both engines on AVX2 alone

llama.cpp runs through llama-cpp-python 0.3.36, installed on first use into its own virtual
environment (default ~/.cache/rapidmoe/llamacpp-venv) and built from source with native tuning
and AMX off (ggml's AMX kernels crash on quantized models on some machines): native tuning off,
and each x86 feature option on when this CPU has it (an AVX2-only CPU gets no AVX-512 code). The build takes about 15 minutes on 2 cores and runs
at nice 10.

Kernel sets. --isa SET runs our engine with that kernel set (RAPIDMOE_ISA in its worker's
environment). --llama-isa avx2 runs llama.cpp from a second build, in ~/.cache/rapidmoe/
llamacpp-venv-avx2, with only the instructions our avx2 set uses (AVX2, FMA, F16C: no AVX-512,
AVX-VNNI or AMX); --isa avx2 picks it unless --llama-isa says otherwise. The output records the
CPU (/proc/cpuinfo), the kernel set our engine used and the features of the llama.cpp build.

Method. The two engines alternate, A B A B ..., each run in a fresh subprocess (so peak RSS is
that engine's alone), with the same thread count for decode and batch. A run loads the model,
warms it up (a prompt and a few decode steps, so the mapping is paged in), then measures

- decode: a 16-token prompt, then 64 single-token evaluations (rapidmoe's Model.eval,
  llama-cpp-python's low-level Llama.eval), each followed by the argmax of the logits; the next
  input is the next token of a fixed random script (--feed greedy feeds the argmax instead: on
  random weights that repeats one token, every step then reads the same experts, and a large L3
  cache can hold part of them, flattering both engines past the bandwidth ceiling); tok/s and
  per-token latency p50/p99;
- prefill: one 512-token evaluation from an empty cache; tok/s;
- peak RSS of the process (VmHWM).

Medians over --runs runs (>= 5 by default), with min..max. The ratio ours / llama.cpp comes with
the spread of the per-pair ratios. The memory read bandwidth is measured with a small C streaming
read compiled on the fly (numpy if there is no C compiler), with the same thread count, over a
buffer in huge pages where the kernel gives them (at the engines' priority with --rt); the decode
ceiling is that bandwidth over the weight bytes one token reads,

    dense_bytes + base_expert_bytes * n_expert_used / n_expert      (rapidmoe's Model.info)

(KV-cache reads are left out: a few hundred KiB at these lengths), and each engine's decode speed
is given as a fraction of it. Both engines run the base file alone (no residual sidecar).

RESplit against a plain file: --ours-model PAIR.gguf runs rapidmoe on that base file with its
residual sidecar under --policy and --budget, while llama.cpp runs MODEL (e.g. the Q8_0 file of
the same checkpoint). The bytes each engine reads per token are then reported separately, ours
with the residual share its policy actually took.

On a machine shared with other work timings swing widely; --rt runs each engine at real-time
priority (chrt -f 1) when the system allows it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

LLAMA_CPP_VERSION = "0.3.36"
# ggml's x86 feature options, each turned on when /proc/cpuinfo lists every flag it needs: a
# portable build (native tuning off) for the machine at hand, so an AVX2-only CPU gets no AVX-512
# code. AMX stays off (ggml's AMX kernels crash on quantized models on some machines).
LLAMA_ISA_OPTIONS = [
    ("GGML_AVX", ["avx"]), ("GGML_AVX2", ["avx2"]), ("GGML_FMA", ["fma"]), ("GGML_F16C", ["f16c"]),
    ("GGML_BMI2", ["bmi2"]), ("GGML_AVX_VNNI", ["avx_vnni"]), ("GGML_AVX512", ["avx512f", "avx512bw", "avx512vl", "avx512dq"]),
    ("GGML_AVX512_VBMI", ["avx512vbmi"]), ("GGML_AVX512_VNNI", ["avx512_vnni"]), ("GGML_AVX512_BF16", ["avx512_bf16"]),
]
LLAMA_FIXED_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
)
# The llama.cpp builds: "best" turns on every option above this CPU has; "avx2" the same without
# AVX-512, as llama.cpp runs on a desktop CPU without it (Intel Core: AVX2 with AVX-VNNI, which
# ggml's AVX2 path uses for its int8 dot products where the CPU has it), so that an --isa avx2
# comparison holds our avx2 set against what such a CPU's llama.cpp does.
LLAMA_ISAS = ("best", "avx2")
LLAMA_AVX2_OPTIONS = {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI"}
# rapidmoe_gguf.kernels.ISAS, spelled out: the llama.cpp worker parses these arguments too, in an
# environment without rapidmoe
OUR_ISAS = ("scalar", "avx2", "avx512", "amx")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), []))
    except OSError:
        return set()


def llama_cmake_args(isa: str = "best", flags: set[str] | None = None) -> str:
    """CMAKE_ARGS of the llama.cpp build ``isa`` (LLAMA_ISAS) for a CPU with ``flags`` (this one's)."""
    flags = cpu_flags() if flags is None else flags
    wanted = [opt for opt, need in LLAMA_ISA_OPTIONS
              if all(x in flags for x in need) and (isa == "best" or opt in LLAMA_AVX2_OPTIONS)]
    on = " ".join(f"-D{opt}={'ON' if opt in wanted else 'OFF'}" for opt, _ in LLAMA_ISA_OPTIONS)
    return f"{on} {LLAMA_FIXED_ARGS}"


DEFAULT_VENV = os.path.join(os.path.expanduser("~"), ".cache", "rapidmoe", "llamacpp-venv")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_venv(llama_isa: str) -> str:
    """Each llama.cpp build in its own environment: the best one where it always was."""
    return DEFAULT_VENV if llama_isa == "best" else f"{DEFAULT_VENV}-{llama_isa}"


# ---------------------------------------------------------------------------------------------
# llama-cpp-python, in its own environment
# ---------------------------------------------------------------------------------------------

def llama_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def llama_installed(venv: str) -> bool:
    py = llama_python(venv)
    if not os.path.exists(py):
        return False
    code = f"import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '{LLAMA_CPP_VERSION}' else 1)"
    return subprocess.run([py, "-c", code], capture_output=True).returncode == 0


def install_llama(venv: str, jobs: int, isa: str = "best") -> None:
    if llama_installed(venv):
        return
    print(f"installing llama-cpp-python=={LLAMA_CPP_VERSION} ({isa} build) into {venv} "
          "(builds llama.cpp: ~15 min on 2 cores)", file=sys.stderr)
    if not os.path.exists(llama_python(venv)):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = dict(os.environ, CMAKE_ARGS=llama_cmake_args(isa), CMAKE_BUILD_PARALLEL_LEVEL=str(jobs), FORCE_CMAKE="1")
    cmd = ["nice", "-n", "10", llama_python(venv), "-m", "pip", "install", "--no-cache-dir",
           f"llama-cpp-python=={LLAMA_CPP_VERSION}", "numpy"]
    log = os.path.join(os.path.dirname(venv), "llamacpp-build.log" if isa == "best" else f"llamacpp-build-{isa}.log")
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not llama_installed(venv):
        raise SystemExit(f"llama-cpp-python build failed (exit {rc}); see {log}")
    print(f"llama-cpp-python installed (build log: {log})", file=sys.stderr)


def llama_system_info(python: str) -> str:
    """llama_print_system_info() of the llama-cpp-python at ``python`` ('' when it cannot say)."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode(errors='replace'))"
    p = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def llama_features(system_info: str) -> list[str]:
    """The features a system-info string says are on: 'CPU : AVX2 = 1 | AVX512 = 0 | ' -> ['AVX2']."""
    return re.findall(r"([A-Za-z0-9_]+) = 1\b", system_info)


def check_llama_build(llama_isa: str, features: list[str], venv: str) -> None:
    """An avx2 comparison against a build with wider instructions would compare instruction sets,
    not engines: e.g. --llama-venv pointing at the best build."""
    wider = [f for f in features if f.startswith(("AVX512", "AMX"))]
    if llama_isa == "avx2" and wider:
        raise SystemExit(f"--llama-isa avx2: the llama.cpp build in {venv} has {', '.join(wider)}; "
                         "give a --llama-venv of its own")


# ---------------------------------------------------------------------------------------------
# What ran: the CPU and our engine's package
# ---------------------------------------------------------------------------------------------

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_info(text: str | None = None) -> dict:
    """The CPU as /proc/cpuinfo (or ``text``) gives its first processor: model name, vendor, family
    and model numbers, and which of CPU_FLAGS it has (None where a field is missing, as off x86)."""
    if text is None:
        try:
            with open("/proc/cpuinfo") as f:
                text = f.read()
        except OSError:
            text = ""
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())

    def number(key: str) -> int | None:
        return int(fields[key]) if fields.get(key, "").isdigit() else None

    return {"model_name": fields.get("model name"), "vendor": fields.get("vendor_id"),
            "family": number("cpu family"), "model": number("model"), "flags": {f: f in flags for f in CPU_FLAGS}}


def package_root() -> str:
    """The folder holding the rapidmoe_gguf this process imports: installed, or a built tree on
    PYTHONPATH."""
    import rapidmoe_gguf

    return os.path.dirname(os.path.dirname(os.path.abspath(rapidmoe_gguf.__file__)))


# ---------------------------------------------------------------------------------------------
# Memory bandwidth
# ---------------------------------------------------------------------------------------------

BANDWIDTH_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
typedef struct { const uint64_t * p; size_t n; uint64_t sum; } job;
static void * reader(void * arg) {
    job * j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) { s0 += j->p[i]; s1 += j->p[i + 1]; s2 += j->p[i + 2]; s3 += j->p[i + 3]; }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char ** argv) {
    const int nt = atoi(argv[1]);
    const size_t bytes = (size_t) atol(argv[2]) << 20, n = bytes / 8;
    uint64_t * buf = NULL;   /* in 2 MiB pages where the kernel gives them, as the weights are */
    if (posix_memalign((void **) &buf, (size_t) 2 << 20, bytes) != 0) return 1;
    madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    double best = 0;
    uint64_t total = 0;
    for (int rep = 0; rep < 7; rep++) {
        pthread_t t[256];
        job j[256];
        const double t0 = now();
        for (int k = 0; k < nt; k++) {
            j[k] = (job){buf + n / nt * k, n / nt, 0};
            pthread_create(&t[k], NULL, reader, &j[k]);
        }
        for (int k = 0; k < nt; k++) { pthread_join(t[k], NULL); total += j[k].sum; }
        const double gbs = (double) (n / nt * nt * 8) / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.3f %llu\n", best, (unsigned long long) total);
    return 0;
}
"""


def memory_bandwidth(n_threads: int, mib: int = 1024, prefix: list[str] | None = None) -> tuple[float, str]:
    """Best read bandwidth in GB/s over 7 passes of a buffer much larger than the caches, in huge
    pages where the kernel has them (rapidmoe reads model files into such pages); ``prefix``: a
    command prefix such as chrt's."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "bw.c"), os.path.join(d, "bw")
            with open(src, "w") as f:
                f.write(BANDWIDTH_C)
            if subprocess.run([cc, "-O3", "-march=native", "-pthread", src, "-o", exe],
                              capture_output=True).returncode == 0:
                out = subprocess.run([*(prefix or []), exe, str(n_threads), str(mib)], capture_output=True, text=True,
                                     check=True)
                return float(out.stdout.split()[0]), "C streaming read"
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones((mib << 20) // 8, dtype=np.uint64)
    parts = np.array_split(a, n_threads)
    best = 0.0
    with ThreadPoolExecutor(n_threads) as ex:
        for _ in range(5):
            t0 = time.perf_counter()
            list(ex.map(lambda p: int(np.add.reduce(p)), parts))
            best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best, "numpy reduction"


# ---------------------------------------------------------------------------------------------
# Workers: one measurement in a fresh process. Only the standard library and numpy at the top,
# so that the llama-cpp-python environment can run this file too.
# ---------------------------------------------------------------------------------------------

def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class OursEngine:
    def __init__(self, path: str, threads: int, n_ctx: int, n_batch: int, policy: str | None = None,
                 budget: float = 0.25):
        import rapidmoe_gguf
        from rapidmoe_gguf import Model, kernels

        if policy:
            self.m = Model(path, n_ctx=n_ctx, n_threads=threads, n_batch=n_batch, residual_policy=policy,
                           residual_budget=budget)
        else:
            self.m = Model(path, n_ctx=n_ctx, n_threads=threads, n_batch=n_batch, residual=None)
        self.n_vocab = self.m.n_vocab
        self.extra = {"info": {k: v for k, v in self.m.info.items() if not k.startswith("_")},
                      "cpu_isa": kernels.cpu_isa(), "package": os.path.dirname(os.path.abspath(rapidmoe_gguf.__file__)),
                      "residual_policy": self.m.residual_policy if policy else None}

    def reset(self) -> None:
        self.m.reset()

    def eval(self, ids):
        return self.m.eval(ids)

    def decode_started(self) -> None:
        self.m.clear_stats()

    def decode_done(self) -> None:
        if self.extra["residual_policy"]:
            self.extra["residual_rate"] = self.m.stats()["residual_rate"]


class LlamaEngine:
    def __init__(self, path: str, threads: int, n_ctx: int, n_batch: int, flash_attn: bool = False):
        import llama_cpp

        self.llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=n_batch, n_ubatch=n_batch, flash_attn=flash_attn, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.extra = {"llama_cpp_version": llama_cpp.__version__, "flash_attn": flash_attn,
                      "system_info": llama_cpp.llama_print_system_info().decode(errors="replace")}

    def reset(self) -> None:
        self.llm.reset()

    def decode_started(self) -> None:
        pass

    def decode_done(self) -> None:
        pass

    def eval(self, ids):
        import numpy as np

        self.llm.eval(list(ids))
        # Llama.eval keeps logits only with logits_all; read the last position's from the context
        return np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.n_vocab,)).copy()


def worker(engine: str, path: str, threads: int, n_prompt: int, n_decode: int, n_prefill: int, feed: str,
           policy: str | None = None, budget: float = 0.25, n_batch: int = 0, flash_attn: bool = False) -> dict:
    import numpy as np

    t0 = time.perf_counter()
    n_ctx = max(n_prefill, n_prompt + n_decode) + 16
    n_batch = n_batch or n_prefill
    if engine == "ours":
        e = OursEngine(path, threads, n_ctx=n_ctx, n_batch=n_batch, policy=policy, budget=budget)
    else:
        e = LlamaEngine(path, threads, n_ctx=n_ctx, n_batch=n_batch, flash_attn=flash_attn)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    # ids past the first few hundred: plain tokens in any vocabulary, no special ones
    prompt = [int(i) for i in rng.integers(300, min(e.n_vocab, 8000), n_prompt)]
    long_prompt = [int(i) for i in rng.integers(300, min(e.n_vocab, 8000), n_prefill)]
    script = [int(i) for i in rng.integers(300, min(e.n_vocab, 8000), n_decode)]

    e.reset()                                    # warm-up: page the weights in
    logits = e.eval(prompt)
    for _ in range(8):
        logits = e.eval([int(np.argmax(logits))])
    e.reset()
    e.eval(long_prompt[:64])

    e.reset()
    logits = e.eval(prompt)
    e.decode_started()
    lat = []
    for k in range(n_decode):
        tok = int(np.argmax(logits))
        tok = tok if feed == "greedy" else script[k]
        t = time.perf_counter()
        logits = e.eval([tok])
        lat.append(time.perf_counter() - t)
    e.decode_done()

    e.reset()
    t = time.perf_counter()
    e.eval(long_prompt)
    prefill_s = time.perf_counter() - t

    lat_ms = sorted(1e3 * x for x in lat)
    return {"engine": engine, "load_s": load_s, "decode_tok_s": n_decode / sum(lat),
            "latency_ms_p50": lat_ms[len(lat_ms) // 2], "latency_ms_p99": lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))],
            "prefill_tok_s": n_prefill / prefill_s, "peak_rss_mib": peak_rss_mib(), **e.extra}


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

def rt_prefix(want: bool) -> list[str]:
    if not want:
        return []
    chrt = shutil.which("chrt")
    if chrt and subprocess.run([chrt, "-f", "1", "true"], capture_output=True).returncode == 0:
        throttle = rt_throttle()
        if throttle:
            print(f"--rt: the kernel throttles real-time tasks ({throttle}): a run that keeps the cores busy "
                  "longer than that is stopped for the rest of each period, which shows as steps up to "
                  "50 ms late; /proc/sys/kernel/sched_rt_runtime_us = -1 turns it off", file=sys.stderr)
        return [chrt, "-f", "1"]
    print("--rt: chrt -f 1 is not permitted here; running at normal priority", file=sys.stderr)
    return []


def rt_throttle() -> str:
    """The kernel's real-time throttling, as 'R of P us' ('' when off or unknown)."""
    try:
        with open("/proc/sys/kernel/sched_rt_runtime_us") as f:
            runtime = int(f.read())
        with open("/proc/sys/kernel/sched_rt_period_us") as f:
            period = int(f.read())
    except (OSError, ValueError):
        return ""
    return f"{runtime} of {period} us" if runtime >= 0 else ""


def worker_env(engine: str, isa: str | None) -> dict:
    # numpy's BLAS threads would compete with the engine's own for the cores (neither uses them)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if engine == "ours":
        # the package this process imports, not the source tree around this file: in an installed
        # run that tree is not built (no native library), and ahead on the path it would shadow the
        # installed package
        env["PYTHONPATH"] = os.pathsep.join(p for p in [package_root(), os.environ.get("PYTHONPATH")] if p)
        if isa:
            env["RAPIDMOE_ISA"] = isa      # read by the native library when it first picks its kernels
    return env


def run_worker(python: str, engine: str, a, prefix: list[str]) -> dict:
    model = a.ours_model if engine == "ours" and a.ours_model else a.model
    cmd = prefix + [python, os.path.abspath(__file__), "--worker", engine, model, "--threads", str(a.threads),
                    "--prompt", str(a.prompt), "--decode", str(a.decode), "--prefill", str(a.prefill), "--feed", a.feed,
                    "--batch", str(a.batch)] + (["--llama-flash-attn"] if engine == "llama.cpp" and a.llama_flash_attn else [])
    if engine == "ours" and a.ours_model:
        cmd += ["--policy", a.policy, "--budget", str(a.budget), "--ours-model", a.ours_model]
    p = subprocess.run(cmd, capture_output=True, text=True, env=worker_env(engine, a.isa), timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{engine} run failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def instruction_sets_header(result: dict) -> str:
    """The CPU and what each engine ran on it, for the table's header."""
    cpu = result["cpu"]
    flags = " ".join(f for f, on in cpu["flags"].items() if on) or "none of " + " ".join(CPU_FLAGS)
    lines = [f"CPU: {cpu['model_name']} ({cpu['vendor']}, family {cpu['family']}, model {cpu['model']}; {flags})"]
    if result["ours_isa"]:
        asked = result["ours_isa"]["requested"]
        lines.append(f"ours: {result['ours_isa']['used']} kernels" + (f" (--isa {asked})" if asked else ""))
    if result["llama_cpp"]:
        ll = result["llama_cpp"]
        lines.append(f"llama.cpp: {ll['isa']} build ({ll['venv']}): {' '.join(ll['features']) or 'features unknown'}")
    return "\n".join(lines)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="the GGUF file both engines run")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=5, help="runs per engine (median reported)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens before decoding")
    ap.add_argument("--decode", type=int, default=64, help="decoded tokens per run")
    ap.add_argument("--prefill", type=int, default=512, help="tokens of the prefill batch")
    ap.add_argument("--batch", type=int, default=0, help="both engines' n_batch (llama.cpp's n_ubatch too; default: "
                                                          "--prefill, one batch): lower it for long prompts, where "
                                                          "llama.cpp without flash attention holds a batch x context "
                                                          "score matrix per head")
    ap.add_argument("--llama-flash-attn", action="store_true", help="llama.cpp with flash attention on "
                                                                      "(llama-cpp-python's default is off)")
    ap.add_argument("--feed", choices=["script", "greedy"], default="script",
                    help="decode input: a fixed random token script (default) or the greedy choice")
    ap.add_argument("--engines", default="ours,llama.cpp", help="comma-separated subset of ours,llama.cpp")
    ap.add_argument("--isa", choices=OUR_ISAS,
                    help="run our engine with this kernel set (RAPIDMOE_ISA; default: the best the CPU has)")
    ap.add_argument("--llama-isa", choices=LLAMA_ISAS,
                    help="llama.cpp build: best (every x86 option this CPU has, AMX off) or avx2 (AVX2, FMA, "
                         "F16C only: no AVX-512, AVX-VNNI or AMX); default avx2 with --isa avx2, else best")
    ap.add_argument("--llama-venv", help="its environment (default: ~/.cache/rapidmoe/llamacpp-venv, "
                                         "with -avx2 appended for the avx2 build)")
    ap.add_argument("--build-jobs", type=int, default=2)
    ap.add_argument("--install-only", action="store_true", help="build llama-cpp-python (--llama-isa's) and exit")
    ap.add_argument("--rt", action="store_true", help="run the engines at real-time priority (chrt -f 1)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--ours-model", help="rapidmoe runs this base file with its residual sidecar instead of MODEL")
    ap.add_argument("--policy", default="umia", help="with --ours-model: the residual policy (default: %(default)s)")
    ap.add_argument("--budget", type=float, default=0.25, help="with --ours-model: the residual budget (default: %(default)s)")
    ap.add_argument("--worker", choices=["ours", "llama.cpp"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker:
        print(json.dumps(worker(a.worker, a.model, a.threads, a.prompt, a.decode, a.prefill, a.feed,
                                policy=a.policy if a.ours_model else None, budget=a.budget, n_batch=a.batch,
                                flash_attn=a.llama_flash_attn)))
        return 0
    engines = [e for e in a.engines.split(",") if e]
    if any(e not in ("ours", "llama.cpp") for e in engines):
        ap.error("--engines: choose from ours, llama.cpp")
    # --isa avx2 alone gives a like-for-like comparison: llama.cpp without AVX-512 too
    a.llama_isa = a.llama_isa or ("avx2" if a.isa == "avx2" else "best")
    a.llama_venv = a.llama_venv or default_venv(a.llama_isa)
    if "llama.cpp" in engines or a.install_only:
        install_llama(a.llama_venv, a.build_jobs, a.llama_isa)
    if a.install_only:
        return 0
    if not a.model or not os.path.isfile(a.model):
        ap.error("give the GGUF file to run")
    if a.ours_model and not os.path.isfile(a.ours_model):
        ap.error(f"--ours-model: no such file: {a.ours_model}")
    if a.isa and "ours" in engines:
        from rapidmoe_gguf import kernels

        # the native library would fall back to its best set with a warning, and the run be mislabelled
        if a.isa not in kernels.supported_isas():
            ap.error(f"--isa {a.isa}: this CPU and build have {', '.join(kernels.supported_isas())}")
    llama_info = None
    if "llama.cpp" in engines:
        system_info = llama_system_info(llama_python(a.llama_venv))
        llama_info = {"isa": a.llama_isa, "venv": a.llama_venv, "system_info": system_info,
                      "features": llama_features(system_info)}
        check_llama_build(a.llama_isa, llama_info["features"], a.llama_venv)

    prefix = rt_prefix(a.rt)
    bw, bw_method = memory_bandwidth(a.threads, prefix=prefix)
    print(f"memory read bandwidth, {a.threads} threads: {bw:.1f} GB/s ({bw_method})", file=sys.stderr)
    pythons = {"ours": sys.executable, "llama.cpp": llama_python(a.llama_venv)}
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for k in range(a.runs):
        for e in engines:  # A B A B ...
            r = run_worker(pythons[e], e, a, prefix)
            runs[e].append(r)
            print(f"run {k + 1}/{a.runs} {e:9}: decode {r['decode_tok_s']:6.1f} tok/s (p50 {r['latency_ms_p50']:.1f} ms, "
                  f"p99 {r['latency_ms_p99']:.1f} ms), prefill {r['prefill_tok_s']:6.1f} tok/s, "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB", file=sys.stderr)

    # bytes one decoded token reads, from rapidmoe's view of the file (a quick load if it did not run)
    info = runs["ours"][0]["info"] if "ours" in runs and not a.ours_model else None
    if info is None:
        from rapidmoe_gguf import Model

        with Model(a.model, n_ctx=64, n_threads=1, residual=None) as m:
            info = dict(m.info)
    token_bytes = info["dense_bytes"] + info["base_expert_bytes"] * info["n_expert_used"] / info["n_expert"]
    ceiling = bw * 1e9 / token_bytes
    ours_bytes = None
    if a.ours_model and "ours" in runs:
        oi, rate = runs["ours"][0]["info"], statistics.median(r.get("residual_rate", 0.0) for r in runs["ours"])
        used = oi["n_expert_used"] / oi["n_expert"]
        ours_bytes = oi["dense_bytes"] + used * (oi["base_expert_bytes"] + rate * oi["residual_expert_bytes"])

    keys = ["decode_tok_s", "latency_ms_p50", "latency_ms_p99", "prefill_tok_s", "peak_rss_mib"]
    result = {
        "model": os.path.abspath(a.model), "threads": a.threads, "runs": a.runs, "realtime": bool(prefix),
        "method": {"prompt": a.prompt, "decode": a.decode, "prefill": a.prefill, "feed": a.feed,
                   "order": "alternating, fresh process per run"},
        "cpu": cpu_info(), "llama_cpp": llama_info,
        "ours_isa": {"requested": a.isa, "used": runs["ours"][0]["cpu_isa"]} if "ours" in runs else None,
        "bandwidth_gb_s": bw, "bandwidth_method": bw_method, "rt_throttle": rt_throttle() if prefix else None, "bytes_per_token": token_bytes,
        "decode_ceiling_tok_s": ceiling,
        "engines": {e: {k: summary([r[k] for r in rs]) for k in keys} for e, rs in runs.items()},
        "raw": runs,
    }
    if ours_bytes is not None:
        result.update({"ours_model": os.path.abspath(a.ours_model), "ours_policy": a.policy, "ours_budget": a.budget,
                       "ours_bytes_per_token": ours_bytes})
    for e in engines:
        cap = bw * 1e9 / ours_bytes if e == "ours" and ours_bytes else ceiling
        result["engines"][e]["ceiling_fraction"] = result["engines"][e]["decode_tok_s"]["median"] / cap
    if len(engines) == 2:
        ratios = {}
        for k in ["decode_tok_s", "prefill_tok_s", "peak_rss_mib"]:
            pair = [o[k] / l[k] for o, l in zip(runs["ours"], runs["llama.cpp"])]
            ratios[k] = {"median_ratio": result["engines"]["ours"][k]["median"] / result["engines"]["llama.cpp"][k]["median"],
                         "pair_min": min(pair), "pair_max": max(pair)}
        result["ours_over_llamacpp"] = ratios
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)

    print(f"\n{os.path.basename(a.model)}: {a.threads} threads, median of {a.runs} runs (min..max); "
          f"bandwidth {bw:.1f} GB/s, {token_bytes / 1e6:.0f} MB read per token -> ceiling {ceiling:.1f} tok/s")
    print(instruction_sets_header(result))
    if ours_bytes is not None:
        print(f"ours runs {os.path.basename(a.ours_model)} + its residual sidecar, policy {a.policy} at {a.budget}: "
              f"{ours_bytes / 1e6:.0f} MB read per token -> ceiling {bw * 1e9 / ours_bytes:.1f} tok/s")
    print(f"| engine | decode tok/s | p50 / p99 ms | prefill tok/s | peak RSS MiB | of ceiling |")
    print(f"|---|---|---|---|---|---|")
    for e in engines:
        s = result["engines"][e]
        d, p, m = s["decode_tok_s"], s["prefill_tok_s"], s["peak_rss_mib"]
        print(f"| {e} | {d['median']:.1f} ({d['min']:.1f}..{d['max']:.1f}) | {s['latency_ms_p50']['median']:.1f} / "
              f"{s['latency_ms_p99']['median']:.1f} | {p['median']:.1f} ({p['min']:.1f}..{p['max']:.1f}) | "
              f"{m['median']:.0f} | {s['ceiling_fraction']:.2f} |")
    if "ours_over_llamacpp" in result:
        r = result["ours_over_llamacpp"]
        print("ours / llama.cpp: " + ", ".join(
            f"{k.replace('_tok_s', '').replace('_mib', '')} {v['median_ratio']:.2f} ({v['pair_min']:.2f}..{v['pair_max']:.2f})"
            for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
