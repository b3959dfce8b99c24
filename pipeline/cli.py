"""``python -m pipeline``: build, merge-index, inspect, verify."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Callable, Sequence

from .build.api import build_folder, build_joblib, build_npz, build_sample_files, write_shards
from .build.engines import ENGINES
from .build.merge import merge_index_files
from .build.output import OutputExistsError
from .build.run import Part
from .build.source import DEFAULT_SHARD_BYTES
from .format.errors import FormatError
from .format.summary import describe
from .format.verify import verify

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256000000, ``"1GiB"`` -> 1073741824, ``"4096"`` -> 4096."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MB, 1GiB, 4096)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefix", help="shard name prefix: <prefix>-000000.tar")
    parser.add_argument("--shard-bytes", type=parse_size, default=DEFAULT_SHARD_BYTES,
                        help="largest shard size (default 256MiB)")
    parser.add_argument("--shard-samples", type=int, help="most samples per shard")
    parser.add_argument("--pack", type=int, default=1, help="samples per record (use 64-1024 for small samples)")
    parser.add_argument("--workers", type=int, default=1, help="processes writing shards in parallel")
    parser.add_argument("--part", type=Part.parse, help="build only part I of N (I/N); join with merge-index")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index and its shards")
    parser.add_argument("--resume", action="store_true",
                        help="complete a killed build: keep the shards it finished, write the rest")
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="what runs the tasks: local processes (default) or a Dask cluster")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="with --engine dask: the cluster's scheduler (default: start one of --workers "
                             "processes here)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"shard_bytes": args.shard_bytes, "shard_samples": args.shard_samples, "pack": args.pack,
            "workers": args.workers, "part": args.part, "overwrite": args.overwrite, "resume": args.resume,
            "engine": args.engine, "scheduler": args.scheduler, "quiet": args.quiet}


def _named_path(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _cmd_arrays(args: argparse.Namespace) -> None:
    if bool(args.array) == bool(args.npz):
        raise SystemExit("error: give either --array NAME=PATH (repeatable) or --npz PATH")
    prefix = args.prefix or "shard"
    if args.npz:
        build_npz(args.npz, args.out, prefix, **_options(args))
    else:
        write_shards(args.out, dict(args.array), prefix, **_options(args))


def _cmd_joblib(args: argparse.Namespace) -> None:
    fields = tuple(args.fields.split(","))
    if len(fields) != 2:
        raise SystemExit("error: --fields takes two names, e.g. x,y")
    build_joblib(args.folder, args.out, args.prefix or "shard", fields, **_options(args))  # type: ignore[arg-type]


def _cmd_files(args: argparse.Namespace) -> None:
    if args.prefix:
        raise SystemExit("error: 'build files' names shards after each split; --prefix does not apply")
    build_sample_files(args.root, args.labels, args.partition, args.out, **_options(args))


def _cmd_folder(args: argparse.Namespace) -> None:
    build_folder(args.folder, args.out, args.prefix or "shard", args.recursive, **_options(args))


def _cmd_merge(args: argparse.Namespace) -> None:
    index, path = merge_index_files(args.parts, args.output, args.overwrite)
    print(f"merged {len(index.shards)} shards, {index.samples} samples -> {path}")


def _cmd_inspect(args: argparse.Namespace) -> None:
    print(describe(args.index, args.samples))


def _cmd_verify(args: argparse.Namespace) -> int:
    def report(info: Any, problem: Any) -> None:
        if not args.quiet:
            print(f"{'FAIL' if problem else 'ok  '} {info.url}", file=sys.stderr)

    problems = verify(args.index, report)
    for problem in problems:
        print(f"error: {problem}")
    if not problems:
        print(f"verified {args.index}: every shard matches its index")
    return 1 if problems else 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="write shards and an index from existing data")
    layouts = build.add_subparsers(dest="layout", required=True)
    arrays = layouts.add_parser("arrays", help="from .npy files (one per field) or an .npz")
    arrays.add_argument("out", help="output folder")
    arrays.add_argument("--array", type=_named_path, action="append", default=[], metavar="NAME=PATH",
                        help="a field and its .npy file (repeat for each field)")
    arrays.add_argument("--npz", help="an .npz file: every array in it is a field")
    arrays.set_defaults(run=_cmd_arrays)
    joblib = layouts.add_parser("joblib", help="from x_<B>.job / y_<B>.job batch files (trusted input only)")
    joblib.add_argument("folder")
    joblib.add_argument("out")
    joblib.add_argument("--fields", default="x,y", help="names of the two fields (default x,y)")
    joblib.set_defaults(run=_cmd_joblib)
    files = layouts.add_parser("files", help="from <root>/<ID>.pt|.npy with labels and partition JSON")
    files.add_argument("root")
    files.add_argument("out", help="output folder; one subfolder per split")
    files.add_argument("--labels", required=True, help='JSON file {"ID": label}')
    files.add_argument("--partition", required=True, help='JSON file {"train": [IDs], "validation": [IDs]}')
    files.set_defaults(run=_cmd_files)
    folder = layouts.add_parser("folder", help="from files grouped by stem (0001.jpg + 0001.json)")
    folder.add_argument("folder")
    folder.add_argument("out")
    folder.add_argument("--recursive", action="store_true", help="include subfolders")
    folder.set_defaults(run=_cmd_folder)
    for sub in (arrays, joblib, files, folder):
        _build_options(sub)

    merge = commands.add_parser("merge-index", help="join the partial indexes of a --part build")
    merge.add_argument("parts", nargs="+", help="partial index files, or folders holding them")
    merge.add_argument("--output", help="index to write (default: index.json beside the first part)")
    merge.add_argument("--overwrite", action="store_true")
    merge.set_defaults(run=_cmd_merge)

    inspect = commands.add_parser("inspect", help="schema, counts, sizes and a few samples")
    inspect.add_argument("index", help="index.json or its folder")
    inspect.add_argument("--samples", type=int, default=3)
    inspect.set_defaults(run=_cmd_inspect)

    check = commands.add_parser("verify", help="check every shard against the index")
    check.add_argument("index", help="index.json or its folder")
    check.add_argument("--quiet", action="store_true")
    check.set_defaults(run=_cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int | None] = args.run
    try:
        return run(args) or 0
    except (FormatError, OSError, ValueError, ImportError, OutputExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
