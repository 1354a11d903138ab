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
    from .recipes import RECIPES

    p.add_argument("src", help="Hugging Face checkpoint directory, or a .gguf file of a supported MoE")
    p.add_argument("out", help="output NAME.gguf (the residual goes to NAME.residual.gguf)")
    p.add_argument("--recipe", default="q4k-q8", choices=list(RECIPES),
                   help="base/residual/other types (default: %(default)s)")
    p.add_argument("--base-type", help="override the experts' base type (e.g. Q4_K)")
    p.add_argument("--residual-type", help="override the residual type, or 'none'")
    p.add_argument("--other-type", help="override the type of the other matrices")
    p.add_argument("--threads", type=int, default=0, help="quantizer threads (default: all cores)")


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert

    r = convert(args.src, args.out, args.recipe, base_type=args.base_type,
                residual_type=args.residual_type, other_type=args.other_type,
                n_threads=args.threads, progress=None)
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

COMMANDS: dict[str, Subcommand] = {
    "convert": Subcommand("convert a Hugging Face checkpoint or a GGUF to a RESplit pair",
                          _convert_args, cmd_convert),
    "inspect": Subcommand("describe a GGUF file and its residual sidecar", _inspect_args, cmd_inspect),
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
