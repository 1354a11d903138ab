"""The ``rapidmoe`` command line.

Each subcommand is two functions, one that declares its arguments and one that runs it and
returns the exit status, plus one row in ``COMMANDS``. Errors raised by the package
(RapidMoEError) and by the operating system are printed as ``error: <message>`` on stderr with
exit status 1, never as a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable

from .errors import RapidMoEError
from .sampling import SAMPLING_DEFAULTS


@dataclasses.dataclass(frozen=True)
class Subcommand:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


# ---------------------------------------------------------------------------------------------
# convert
# ---------------------------------------------------------------------------------------------

def _convert_args(p: argparse.ArgumentParser) -> None:
    from .convert.recipes import RECIPES

    p.add_argument("src", help="Hugging Face checkpoint directory, or a .gguf file of a supported MoE")
    p.add_argument("out", help="output NAME.gguf (the residual goes to NAME.residual.gguf)")
    p.add_argument("--recipe", default="q4k-q8", choices=list(RECIPES),
                   help="base/residual/other types (default: %(default)s)")
    p.add_argument("--base-type", help="override the experts' base type (e.g. Q4_K)")
    p.add_argument("--residual-type", help="override the residual type, or 'none'")
    p.add_argument("--other-type", help="override the type of the other matrices")
    p.add_argument("--threads", type=int, default=0, help="quantizer threads (default: all cores)")
    p.add_argument("--imatrix", metavar="FILE",
                   help="llama.cpp importance matrix (llama-imatrix's GGUF) for the codebook bases (IQ2_XXS, IQ3_XXS)")
    p.add_argument("--calibrate", metavar="TEXT", help="calibrate UMIA on this text file in the same run")
    p.add_argument("--pre-tokenizer", metavar="NAME",
                   help="llama.cpp's pre-tokenizer name (tokenizer.ggml.pre) for a Hugging Face tokenizer that "
                        "splits by that rule but whose fingerprint is not known (warned about when it differs)")
    p.add_argument("--calibrate-tokens", type=int, default=4096, help="calibration tokens (default: %(default)s)")


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert
    from .evaluate import calibrate

    calib_text = None
    if args.calibrate:  # read it first: a missing file must not cost a whole conversion
        with open(args.calibrate, encoding="utf-8") as f:
            calib_text = f.read()

    r = convert(args.src, args.out, args.recipe, base_type=args.base_type,
                residual_type=args.residual_type, other_type=args.other_type,
                n_threads=args.threads, progress=None, imatrix=args.imatrix, pre_tokenizer=args.pre_tokenizer)
    print(f"wrote {r.base_path} ({_human_bytes(os.path.getsize(r.base_path))})")
    if r.residual_path:
        print(f"wrote {r.residual_path} ({_human_bytes(os.path.getsize(r.residual_path))})")
    print(f"{r.architecture}, recipe {r.recipe}: {r.n_tensors} tensors in {r.seconds:.1f} s")
    line = f"experts: {r.bpw_base:.3f} bits/weight base"
    if r.residual_path:
        line += f", {r.bpw_total:.3f} base+residual"
    print(line)
    if r.error_base is not None:
        line = f"experts: relative error {r.error_base:.4g} base"
        if r.residual_path:
            line += f", {r.error_total:.4g} base+residual"
        print(line)
    for f in r.fallbacks:
        print(f"fallback: {f.tensor}: {f.used} instead of {f.wanted} ({f.reason})")
    if r.kept_sidecar:
        print(f"kept {r.kept_sidecar}: the earlier sidecar, which fits no base now")
    if calib_text is not None:
        if not r.residual_path:
            raise RapidMoEError("--calibrate needs a recipe with a residual")
        t = calibrate(r.base_path, calib_text, max_tokens=args.calibrate_tokens, n_threads=args.threads)
        print(f"calibrated UMIA on {t.n_tokens} tokens")
    return 0


# ---------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------

def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a GGUF file (a base, a stock llama.cpp file, or a .residual.gguf)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def cmd_inspect(args: argparse.Namespace) -> int:
    from .resplit import describe

    info = describe(args.file)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"file:         {info['path']} ({_human_bytes(info['file_size'])}, {info['kind']})")
    print(f"architecture: {info['architecture']}" + (f"  name: {info['name']}" if info["name"] else ""))
    if info["rapidmoe"]:
        print("rapidmoe:     " + ", ".join(f"{k[len('rapidmoe.'):]}={v}" for k, v in info["rapidmoe"].items()))
    if info["hparams"]:
        print("hyperparameters:")
        for k, v in info["hparams"].items():
            print(f"  {k:40s} {v:.7g}" if isinstance(v, float) else f"  {k:40s} {v}")
    _print_types(f"tensors: {info['n_tensors']}", info["types"])
    if info["kind"] == "residual":
        return 0
    fmt = info["tool_call_format"]
    print("tool calls:   " + (f"{fmt} format" if fmt else "none (no chat template)"))
    sc = info["sidecar"]
    if sc is None:
        print("sidecar:      none (base only)")
    elif sc["matches"]:
        _print_types(f"sidecar:      {sc['path']} (matches; {sc['n_tensors']} tensors)", sc["types"])
    else:
        print(f"sidecar:      {sc['path']} DOES NOT MATCH: {sc['error']}")
    ex = info["experts"]
    if ex["n_weights"]:
        line = f"experts:      {ex['n_tensors']} tensors, {ex['n_weights']:,} weights, {ex['bpw_base']:.3f} bits/weight base"
        if ex["residual_bytes"]:
            line += f", {ex['bpw_base_residual']:.3f} base+residual"
        print(line)
    return 0


def _print_types(title: str, types: dict) -> None:
    print(title)
    for name, row in sorted(types.items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"  {name:6s} {row['count']:6d} tensors {_human_bytes(row['bytes']):>12s}")


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

def _add_model_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    from .umia import DEFAULT_BUDGET, POLICIES

    if optional:
        p.add_argument("model", nargs="?", help="base .gguf (default: the bundled model)")
    else:
        p.add_argument("model", help="base .gguf; NAME.residual.gguf beside it is used when present")
    p.add_argument("--threads", "-t", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--ctx", "-c", type=int, default=2048, help="context size in tokens (default: %(default)s)")
    from .model import CACHE_TYPES
    for flag, short in (("k", "-ctk"), ("v", "-ctv")):
        p.add_argument(f"--cache-type-{flag}", short, type=str.lower, choices=CACHE_TYPES, default=None,
                       help=f"the KV cache's {flag.upper()} element type, as llama.cpp names them (default: "
                            f"$RAPIDMOE_CACHE_TYPE_{flag.upper()}, else f16, or f32 with a GPU budget; other types "
                            f"than f32: CPU only; multi-head latent attention caches its latents in the K type)")
    p.add_argument("--policy", choices=POLICIES, default="umia",
                   help="which activated experts get their residual (default: %(default)s)")
    p.add_argument("--budget", type=_budget_arg, default=DEFAULT_BUDGET,
                   help="share of activated expert slots that get the residual, or 'auto' to let the CPU/GPU "
                        "split find it (default: %(default)s)")
    p.add_argument("--no-residual", action="store_true", help="ignore the residual sidecar")
    p.add_argument("--gpu-mem", default=None,
                   help="run on the GPU within this much device memory, e.g. 8GiB (default: CPU only)")
    p.add_argument("--gpu-device", type=int, default=0, help="CUDA device ordinal (default: %(default)s)")
    p.add_argument("--gpu-backend", choices=["cuda", "standin"], default="cuda",
                   help="with --gpu-mem: the CUDA device, or a CPU stand-in for it that runs the same placement "
                        "and split without a GPU, to check them (never faster; default: %(default)s)")
    mm = p.add_mutually_exclusive_group()
    mm.add_argument("--mmap", dest="use_mmap", action="store_const", const=True, default=None,
                    help="map the model files (pages read on first use; runs models larger than the memory)")
    mm.add_argument("--no-mmap", dest="use_mmap", action="store_const", const=False,
                    help="read the model files into memory, in huge pages where the kernel has them (faster "
                         "decode). Default: read when they fit in 3/4 of the available memory, else stream the "
                         "experts (--ram-budget auto)")
    mm.add_argument("--ram-budget", default=None, metavar="SIZE",
                    help="run a model larger than the memory: keep all but the routed experts in memory and read "
                         "each expert from the file when a token needs it, into a cache that fills the rest of SIZE "
                         "(e.g. 12GiB, or 'auto': 3/4 of the memory this process may take). CPU only")
    p.add_argument("--prefetch", choices=("none", "known", "predict"), default="known",
                   help="with --ram-budget: read ahead a batch's experts beyond what the cache holds at once "
                        "(known), also the next layer's as predicted (predict), or nothing (default: %(default)s)")


def _budget_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1] or 'auto', got {text!r}") from None


def _budget_str(b) -> str:
    return b if isinstance(b, str) else f"{b:g}"


def _model_path_and_kwargs(args: argparse.Namespace) -> tuple[str, dict]:
    """The model file (the bundled one when none is given) and Model's keyword arguments."""
    from .bundled import bundled_model_path

    return args.model or bundled_model_path(), dict(
        n_ctx=args.ctx, n_threads=args.threads, n_batch=getattr(args, "batch", 512),
        residual=None if args.no_residual else "auto", residual_policy=args.policy, residual_budget=args.budget,
        gpu_memory=args.gpu_mem, gpu_device=args.gpu_device, gpu_backend=args.gpu_backend,
        gpu_sessions=max(1, getattr(args, "parallel", 1)), use_mmap=getattr(args, "use_mmap", None),
        ram_budget=getattr(args, "ram_budget", None), prefetch=getattr(args, "prefetch", "known"),
        cache_type_k=getattr(args, "cache_type_k", None), cache_type_v=getattr(args, "cache_type_v", None))


def _open_model(args: argparse.Namespace):
    from .model import Model

    path, kwargs = _model_path_and_kwargs(args)
    return Model(path, **kwargs)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampling flags; their defaults are SamplingParams'."""
    d = SAMPLING_DEFAULTS
    p.add_argument("--temp", type=float, default=d["temperature"], help="temperature; 0 is greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=d["top_k"], help="(default: %(default)s; 0 is off)")
    p.add_argument("--top-p", type=float, default=d["top_p"], help="(default: %(default)s; 1 is off)")
    p.add_argument("--min-p", type=float, default=d["min_p"], help="(default: %(default)s; 0 is off)")
    p.add_argument("--repeat-penalty", type=float, default=d["repeat_penalty"], help="(default: %(default)s; 1 is off)")
    p.add_argument("--seed", type=int, default=d["seed"], help="sampling seed (default: random)")


def _run_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, optional=True)
    p.add_argument("--prompt", "-p", default="The meaning of the word", help="prompt text")
    p.add_argument("--n-predict", "-n", type=int, default=64, help="tokens to generate (default: %(default)s)")
    _sampling_args(p)
    p.add_argument("--stats", action="store_true", help="print expert usage and residual decisions")


def cmd_run(args: argparse.Namespace) -> int:
    from .model import SamplingParams

    sampling = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed)
    with _open_model(args) as m:
        m.clear_stats()
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
        for piece in m.stream(args.prompt, args.n_predict, sampling=sampling):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        t = m.last_timings
        st = m.stats()
        pp = t["prompt_tokens"] / t["prompt_s"] if t.get("prompt_s") else 0.0
        tg = t["gen_tokens"] / t["gen_s"] if t.get("gen_s") else 0.0
        res = (f"residual rate {st['residual_rate']:.3f} (policy {st['policy']}, budget {_budget_str(st['budget'])})"
               if m.residual_path else "no residual sidecar")
        print(f"prompt {t['prompt_tokens']} tokens, {pp:.1f} tok/s | generated {t['gen_tokens']} tokens, "
              f"{tg:.1f} tok/s | {res}", file=sys.stderr)
        if args.stats:
            _print_stats(st)
            _print_expert_cache(m.expert_cache)
    return 0


def _print_expert_cache(c: dict) -> None:
    """A streamed model's expert cache (--ram-budget): nothing for a model wholly in memory."""
    if not c["streaming"]:
        return
    gib = 1 << 30
    print(f"expert cache: {c['cache_bytes'] / gib:.2f} GiB in {c['slots']} slots ({c['slots_used']} used), "
          f"{c['resident_bytes'] / gib:.2f} GiB resident, budget {c['budget_bytes'] / gib:.2f} GiB; "
          f"hit rate {c['hit_rate']:.3f}, {c['misses']} read on demand, {c['prefetched']} read ahead "
          f"({c['prefetch_accuracy']:.2f} of them used), {c['bytes_read'] / gib:.2f} GiB read "
          f"({'O_DIRECT' if c['direct_io'] else 'page cache'}), {c['wait_s']:.2f} s waited", file=sys.stderr)


def _print_stats(st: dict) -> None:
    act, res = st["active"], st["residual"]
    print("layer  activations  residual  rate   busiest experts", file=sys.stderr)
    for layer in range(act.shape[0]):
        a, r = int(act[layer].sum()), int(res[layer].sum())
        top = act[layer].argsort()[::-1][:4]
        busiest = " ".join(f"{e}:{int(act[layer, e])}" for e in top)
        print(f"{layer:5d}  {a:11d}  {r:8d}  {r / a if a else 0:.3f}  {busiest}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# perplexity, calibrate
# ---------------------------------------------------------------------------------------------

def _perplexity_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, optional=True)
    p.add_argument("-f", "--file", help="text file (default: the bundled model's held-out text)")
    p.add_argument("--reference", default="all",
                   help="'all' (the same model, every residual applied), 'none', or another GGUF (default: all)")
    p.add_argument("--chunk", type=int, default=256, help="tokens per chunk, as llama.cpp's n_ctx (default: %(default)s)")
    p.add_argument("--chunks", type=int, default=0, help="evaluate at most this many chunks (0: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .bundled import bundled_heldout_path
    from .evaluate import perplexity
    from .model import Model

    path = args.file or bundled_heldout_path()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    args.ctx = max(args.ctx, args.chunk)
    with _open_model(args) as m:
        ids = m.tokenize(text, add_special=False)
        if args.reference in ("all", "none"):
            ref = Model(m.path, n_ctx=args.ctx, n_threads=args.threads,
                        residual=m.residual_path if args.reference == "all" else None,
                        residual_policy=args.reference)
        else:
            ref = Model(args.reference, n_ctx=args.ctx, n_threads=args.threads)
        with ref:
            r = perplexity(m, ids, args.chunk, reference=ref, max_chunks=args.chunks or None)
    print(f"ppl {r.ppl:.4f} over {r.n_tokens} tokens | KLD mean {r.kld_mean:.6f} p99 {r.kld_p99:.6f} | "
          f"top-1 {r.top1:.4f} | residual rate {r.residual_rate:.3f} ({r.policy}, budget {_budget_str(r.budget)}) | "
          f"{r.bytes_per_token / 2**20:.3f} MiB of weights per token")
    if args.json:
        print(json.dumps(r.as_dict()))
    return 0


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="base .gguf with its NAME.residual.gguf beside it")
    p.add_argument("-f", "--file", required=True, help="calibration text")
    p.add_argument("--tokens", type=int, default=4096, help="calibration tokens (default: %(default)s)")
    p.add_argument("--chunk", type=int, default=256, help="tokens per chunk (default: %(default)s)")
    p.add_argument("--threads", "-t", type=int, default=0)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .evaluate import calibrate

    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    t = calibrate(args.model, text, n_ctx=args.chunk, max_tokens=args.tokens, n_threads=args.threads)
    print(f"calibrated on {t.n_tokens} tokens; layer sensitivity (KL when base only): "
          + " ".join(f"{v:.4g}" for v in t.layer_sensitivity))
    return 0


def _imatrix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".gguf to run (best the most precise one at hand, e.g. an f32 or q8_0 conversion)")
    p.add_argument("-f", "--file", required=True, help="calibration text")
    p.add_argument("-o", "--output", required=True, help="imatrix .gguf to write (llama.cpp's format)")
    p.add_argument("--tokens", type=int, default=None, help="at most this many tokens (default: all)")
    p.add_argument("--chunk", type=int, default=512, help="tokens per chunk (default: %(default)s)")
    p.add_argument("--threads", "-t", type=int, default=0)


def cmd_imatrix(args: argparse.Namespace) -> int:
    from .convert.imatrix import compute_imatrix

    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    r = compute_imatrix(args.model, text, args.output, n_ctx=args.chunk, max_tokens=args.tokens,
                        n_threads=args.threads, dataset=os.path.basename(args.file))
    print(f"wrote {args.output}: {r['entries']} expert tensors, {r['chunks']} chunks of {args.chunk} tokens")
    return 0


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------

def _plan_args(p: argparse.ArgumentParser) -> None:
    from .planner import Hardware
    from .umia import PLAN_BUDGET

    hw = Hardware()
    p.add_argument("model", help="base .gguf; NAME.residual.gguf beside it is used when present")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpu-mem", help="device memory budget, e.g. 8GiB, 24GB, 12000MiB")
    where.add_argument("--ram-budget", help="plan a model larger than the memory instead: its experts streamed from "
                                            "the disk within this much RAM (run/serve --ram-budget)")
    p.add_argument("--disk-bw", type=float, default=3.0,
                   help="with --ram-budget: the disk's read bandwidth in GB/s (default: %(default)s, an NVMe drive)")
    p.add_argument("--ctx", "-c", type=int, default=4096, help="context size in tokens (default: %(default)s)")
    p.add_argument("--batch", type=int, default=512, help="prefill batch size (default: %(default)s)")
    p.add_argument("--budget", type=float, default=PLAN_BUDGET,
                   help="residual budget for the per-token prediction (default: %(default)s)")
    p.add_argument("--no-residual", action="store_true", help="plan without the residual sidecar")
    p.add_argument("--host-bw", type=float, default=None,
                   help="host memory bandwidth in GB/s (default: measured with a quick numpy copy)")
    p.add_argument("--pcie-gbps", type=float, default=hw.pcie_gbps,
                   help="host-to-device bandwidth in GB/s (default: %(default)s, PCIe 4.0 x16)")
    p.add_argument("--gpu-bw", type=float, default=hw.gpu_bw_gbps,
                   help="GPU memory bandwidth in GB/s (default: %(default)s)")
    p.add_argument("--gpu-tflops", type=float, default=hw.gpu_tflops,
                   help="fp32 TFLOP/s of the GPU's dequantizing kernels (default: %(default)s)")
    p.add_argument("--cpu-gflops", type=float, default=hw.cpu_gflops,
                   help="GFLOP/s of the host's quantized products, all threads (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_plan(args: argparse.Namespace) -> int:
    from .planner import Hardware, plan_files, stream_plan

    if args.ram_budget:
        sp = stream_plan(args.model, args.ram_budget, residual=None if args.no_residual else "auto",
                         residual_budget=args.budget, disk_bw_gbps=args.disk_bw, host_bw_gbps=args.host_bw)
        print(sp.to_json() if args.json else sp.summary())
        return 0

    hw = Hardware(host_bw_gbps=args.host_bw, pcie_gbps=args.pcie_gbps, gpu_bw_gbps=args.gpu_bw,
                  gpu_tflops=args.gpu_tflops, cpu_gflops=args.cpu_gflops)
    p = plan_files(args.model, args.gpu_mem, args.ctx, residual=None if args.no_residual else "auto",
                   n_batch=args.batch, residual_budget=args.budget, hardware=hw)
    print(p.to_json() if args.json else p.summary())
    return 0


# ---------------------------------------------------------------------------------------------
# chat, serve
# ---------------------------------------------------------------------------------------------

def _chat_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, optional=True)
    p.add_argument("--system", "-s", help="a system message that starts the conversation")
    p.add_argument("--n-predict", "-n", type=int, default=None,
                   help="most tokens per reply (default: up to the end of the context)")
    p.add_argument("--reasoning-effort", choices=("none", "minimal", "low", "medium", "high", "xhigh", "max"),
                   help="the reasoning effort the chat template writes (gpt-oss: low to high; DeepSeek-V4: max; "
                        "none: thinking off; default: the template's own)")
    p.add_argument("--show-reasoning", action="store_true",
                   help="gpt-oss: also print the analysis channel (the model's reasoning), dimmed")
    _sampling_args(p)


CHAT_HELP = "/reset starts a new conversation, /quit (or Ctrl-D) leaves, Ctrl-C stops a reply"


def cmd_chat(args: argparse.Namespace) -> int:
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    sampling = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                    repeat_penalty=args.repeat_penalty, seed=args.seed)
    with _open_model(args) as m:
        print(f"{os.path.basename(m.path)}: {CHAT_HELP}", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            if line.strip() == "/quit":
                return 0
            if line.strip() == "/reset":
                history = list(start)
                print("(new conversation)", file=sys.stderr)
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            reply = []
            try:
                for chunk in m.create_chat_completion(history, max_tokens=args.n_predict, stream=True,
                                                      reasoning_effort=args.reasoning_effort,
                                                      show_reasoning=args.show_reasoning, **sampling):
                    delta = chunk["choices"][0]["delta"]
                    if delta.get("reasoning_content"):
                        sys.stdout.write("\033[2m" + delta["reasoning_content"] + "\033[0m")
                    piece = delta.get("content", "")
                    reply.append(piece)
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                print(" [stopped]", end="")
            except RapidMoEError as exc:
                history.pop()
                print(f"error: {exc}" + ("; /reset starts over" if len(history) > len(start) else ""),
                      file=sys.stderr)
                continue
            print()
            history.append({"role": "assistant", "content": "".join(reply)})


def _serve_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, optional=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s; "
                   "0.0.0.0 makes the server reachable from other machines)")
    p.add_argument("--port", type=int, default=8080, help="(default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("RAPIDMOE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every API request (default: $RAPIDMOE_API_KEY; "
                        "/health and the page at / stay open)")
    p.add_argument("--parallel", "-np", type=int, default=1,
                   help="requests generated at once, each with its own KV cache of --ctx tokens (default: %(default)s)")
    p.add_argument("--queue", type=int, default=16,
                   help="requests that may wait for a free slot; more get 503 (default: %(default)s)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prompt tokens evaluated per step beside the running requests' next tokens: smaller keeps "
                        "their tokens coming while a long prompt is read, larger reads it sooner (default: 64)")
    p.add_argument("--step-latency", type=float, default=None, metavar="F",
                   help="fewer prompt tokens per step beside the running requests' tokens where needed to keep "
                        "a step within F times a step of their tokens alone, learnt from the steps' times; "
                        "0: off (default: 2.5)")
    p.add_argument("--name", help="the model name the API reports (default: the file name without .gguf)")
    p.add_argument("--alias", action="append", default=[], metavar="NAME",
                   help="another name requests may give the model (repeatable)")
    p.add_argument("--any-model", action="store_true",
                   help="accept any model name in requests (clients configured with a fixed name otherwise get 404)")
    p.add_argument("--max-prompt-chars", type=int, default=None,
                   help="longest prompt (or messages, or rendered chat template) in characters; longer ones get "
                        "400 before they are tokenized (default: 16 per context token)")
    p.add_argument("--template-timeout", type=float, default=None,
                   help="seconds one render of the model's chat template may take (default: 2)")
    p.add_argument("--reasoning-format", choices=("auto", "deepseek", "none"), default="auto",
                   help="a thinking model's <think> block (Qwen3, DeepSeek-R1, GLM): in the message's "
                        "reasoning_content (auto, deepseek; the default) or left in its content (none); a request's "
                        "reasoning_format overrides it")
    p.add_argument("--slot-save-path", default=None, metavar="DIR",
                   help="a folder for POST /slots/{id}?action=save|restore (llama-server's slot save and restore: "
                        "a slot's sequence, KV cache included, to and from a file there); default: those refused")
    p.add_argument("--header-timeout", type=float, default=None, metavar="S",
                   help="seconds a client has to send a request's line and headers, from connecting or from its "
                        "first byte on a kept-alive connection; later, the connection is closed (with 408 if part "
                        "of a head came); 0: no limit (default: 10; under --ray-replicas Ray's proxy reads heads)")
    p.add_argument("--body-timeout", type=float, default=None, metavar="S",
                   help="seconds from a request's head to the last byte of its body; later, 408 and the "
                        "connection is closed; 0: no limit (default: 30)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name to serve besides localhost and IP addresses (repeatable; other names get 421, "
                        "against DNS rebinding)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (e.g. http://localhost:3000) whose pages may call the API (repeatable; "
                        "default: none)")
    p.add_argument("--ray-replicas", type=int, default=None, metavar="N",
                   help="start a local Ray and serve N replicas of the server (each its own process, model and "
                        "--parallel slots, --threads default: cores / N) behind one address with Ray Serve; "
                        "needs pip install 'rapidmoe-gguf[ray]' (docs/SCALING.md)")


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import ServerConfig, check_api_key, serve

    if args.parallel < 1 or args.queue < 0 or args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise RapidMoEError(f"--parallel and --prefill-chunk must be >= 1 and --queue >= 0, got {args.parallel}, "
                            f"{args.prefill_chunk} and {args.queue}")
    check_api_key(args.api_key)
    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key, parallel=args.parallel,
                          queue=args.queue, model_name=args.name, aliases=args.alias, any_model=args.any_model, max_prompt_chars=args.max_prompt_chars,
                          allowed_hosts=args.allowed_host, cors_origins=args.cors_origin,
                          reasoning_format=args.reasoning_format)
    if args.slot_save_path is not None:
        if not os.path.isdir(args.slot_save_path):
            raise RapidMoEError(f"--slot-save-path {args.slot_save_path}: not a folder")
        config.slot_save_path = os.path.abspath(args.slot_save_path)
    if args.template_timeout is not None:
        config.template_timeout = args.template_timeout
    for name in ("header_timeout", "body_timeout"):        # 0: off (None in ServerConfig)
        seconds = getattr(args, name)
        if seconds is not None:
            if not 0 <= seconds < float("inf"):
                raise RapidMoEError(f"--{name.replace('_', '-')} must be >= 0 seconds (0: no limit), got {seconds}")
            setattr(config, name, seconds or None)
    if args.prefill_chunk is not None:
        config.prefill_chunk = args.prefill_chunk
    if args.step_latency is not None:
        if args.step_latency != 0 and not args.step_latency > 1:
            raise RapidMoEError(f"--step-latency must be > 1, or 0 for off; got {args.step_latency}")
        config.step_latency = args.step_latency or None
    if args.ray_replicas is not None:
        return _serve_on_ray(args, config)
    with _open_model(args) as m:
        res = (f"residual policy {m.residual_policy}, budget {_budget_str(m.residual_budget)}" if m.residual_path
               else "no residual sidecar")
        print(f"serving {m.path} ({res}) on http://{args.host}:{args.port}/ with {args.parallel} slot(s) of "
              f"{m.n_ctx} tokens" + (", API key required" if args.api_key else ""), file=sys.stderr)
        serve(m, config, log_level="info" if args.verbose else "warning")
    return 0


def _serve_on_ray(args: argparse.Namespace, config) -> int:
    from . import ray_serve

    if args.ray_replicas < 1:
        raise RapidMoEError(f"--ray-replicas must be >= 1, got {args.ray_replicas}")
    if args.gpu_mem is not None:
        raise RapidMoEError("--ray-replicas serves from the CPU; it cannot be combined with --gpu-mem yet")
    path, kwargs = _model_path_and_kwargs(args)
    ray_serve.deployment(path, replicas=args.ray_replicas, model_kwargs=kwargs)   # checks first: ray, the file
    threads = kwargs["n_threads"] or ray_serve.replica_threads(args.ray_replicas)
    print(f"serving {path} with Ray Serve: {args.ray_replicas} replica(s) of {threads} thread(s) and "
          f"{args.parallel} slot(s) of {args.ctx} tokens each, on http://{args.host}:{args.port}/ (Ctrl-C stops)",
          file=sys.stderr)
    ray_serve.run(path, replicas=args.ray_replicas, host=args.host, port=args.port, model_kwargs=kwargs,
                  config=config, log_level="INFO" if args.verbose else "WARNING")
    return 0


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------

def _bench_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, optional=True)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens before decoding (default: %(default)s)")
    p.add_argument("--decode", "-n", type=int, default=64, help="tokens decoded one at a time (default: %(default)s)")
    p.add_argument("--prefill", type=int, default=512, help="tokens of the prefill prompt (default: %(default)s)")
    p.add_argument("--batch", type=int, default=512, help="tokens per evaluation batch in prefill (default: %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs; figures are medians (default: %(default)s)")
    p.add_argument("--profile", action="store_true", help="also show where the time goes, per part of the forward pass")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    if min(args.prompt, args.decode, args.prefill, args.runs, args.batch) < 1:
        raise RapidMoEError("--prompt, --decode, --prefill, --batch and --runs must be >= 1")
    args.ctx = max(args.ctx, args.prompt + args.decode, args.prefill)
    with _open_model(args) as m:
        r = bench.run(m, prompt=args.prompt, decode=args.decode, prefill=args.prefill, runs=args.runs,
                      profile=args.profile)
    print(json.dumps(r, indent=2) if args.json else bench.format_report(r))
    return 0


COMMANDS: dict[str, Subcommand] = {
    "plan": Subcommand("place a model on a GPU within a memory budget and predict the bytes each side reads",
                       _plan_args, cmd_plan),
    "perplexity": Subcommand("perplexity and divergence from a reference, with a residual policy",
                             _perplexity_args, cmd_perplexity),
    "calibrate": Subcommand("measure UMIA's tables on text and store them in the sidecar",
                            _calibrate_args, cmd_calibrate),
    "imatrix": Subcommand("the importance of the experts' input columns on text (for --imatrix)",
                          _imatrix_args, cmd_imatrix),
    "run": Subcommand("generate text from a prompt, streaming it", _run_args, cmd_run),
    "chat": Subcommand("chat in the terminal with the model's chat template", _chat_args, cmd_chat),
    "serve": Subcommand("an OpenAI-compatible HTTP server with a web chat page", _serve_args, cmd_serve),
    "convert": Subcommand("convert a Hugging Face checkpoint or a GGUF to a RESplit pair",
                          _convert_args, cmd_convert),
    "inspect": Subcommand("describe a GGUF file and its residual sidecar", _inspect_args, cmd_inspect),
    "bench": Subcommand("prefill and decode speed on this machine, and where the time goes (--profile)",
                        _bench_args, cmd_bench),
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="rapidmoe", description="Run MoE LLMs from RESplit GGUF files.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    try:
        return args._run(args)
    except RapidMoEError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
