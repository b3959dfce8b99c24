"""Build shards from existing data, join the indexes of a build in parts, inspect and verify shard sets, and
tune a loader to the machine."""

from __future__ import annotations

import argparse
import io
import os
import sys
import warnings
from typing import Any, Callable, Sequence

from . import build_arrow, build_parquet
from . import cli_values as values
from .check.describe import describe_parts
from .check.verify import NOTE, check_sets
from .cli_build_end import BuildEnd
from .cli_tune import add_tune_arguments
from .format.errors import FormatError, InputChanged
from .format.verify import Problem
from .interrupts import reliable_ctrl_c
from .write.api import build_folder, build_imagefolder, build_joblib, build_npz, build_sample_files, write_shards
from .write.engines import ENGINES
from .write.indexing import index_shards
from .write.merge import merge_index_files
from .write.output import OutputExistsError
from .write.source import DEFAULT_SHARD_BYTES
from .write.sources.joblib_lists import LISTS


def _build_options(parser: argparse.ArgumentParser, splits: bool = True) -> None:
    parser.add_argument("--shard-bytes", type=values.shard_bytes, default=DEFAULT_SHARD_BYTES, metavar="SIZE",
                        help="largest shard size, e.g. 256MiB, 1GB, or none for no size limit (default 256MiB)")
    parser.add_argument("--shard-samples", type=values.positive, metavar="N", help="most samples per shard")
    parser.add_argument("--pack", type=values.pack, default="auto", metavar="K",
                        help="samples per record; 'auto' (default) fills records of about 64 KiB with "
                             "fixed-shape samples (smaller ones in a set under 32 MiB: 512 records at least, to "
                             "shuffle), one sample per record when larger or when samples may differ in shape "
                             "(one file per sample, folders, images)")
    parser.add_argument("--dtype", type=values.pair("FIELD=DTYPE"), action="append", default=[], metavar="FIELD=DTYPE",
                        help="store FIELD as DTYPE, e.g. x=float32 to halve float64 data (repeatable)")
    if splits:
        parser.add_argument("--prefix", help="shard name prefix: <prefix>-000000.tar (default: shard)")
        parser.add_argument("--validation", type=values.validation, metavar="FRACTION|N",
                            help="hold out this share (0.1) or number (5000) of samples: writes OUT/train "
                                 "and OUT/validation")
        parser.add_argument("--seed", type=int, default=0, help="seed of the --validation split (default 0)")
    parser.add_argument("--workers", type=values.positive, default=1, metavar="N",
                        help="processes writing shards in parallel (default 1)")
    parser.add_argument("--part", type=values.part, metavar="I/N",
                        help="build only part I of N (parts count from 0); join them with merge-index")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index and its shards")
    parser.add_argument("--resume", action="store_true",
                        help="complete a killed build: keep the shards it finished, write the rest")
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="what runs the tasks: local processes (default) or a Dask cluster")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="with --engine dask: the cluster's scheduler (default: start one of --workers "
                             "processes here)")
    parser.add_argument("--quiet", action="store_true", help="no progress or summary")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options = {"shard_bytes": args.shard_bytes, "shard_samples": args.shard_samples, "pack": args.pack,
               "dtypes": values.named(args.dtype, "--dtype"), "workers": args.workers, "part": args.part,
               "overwrite": args.overwrite, "resume": args.resume, "engine": args.engine,
               "scheduler": args.scheduler, "quiet": args.quiet}
    if "validation" in args:
        options.update(prefix="shard" if args.prefix is None else args.prefix, validation=args.validation,
                       seed=args.seed)
        if args.validation is not None and args.prefix:
            raise SystemExit("error: with --validation, shards are named after each split (train-000000.tar); "
                             "--prefix does not apply")
    return options


def _cmd_arrays(args: argparse.Namespace) -> None:
    if bool(args.array) == bool(args.npz):
        raise SystemExit("error: give either --array NAME=PATH (repeatable) or --npz PATH")
    if args.npz:
        build_npz(args.npz, args.out, **_options(args))
    else:
        write_shards(args.out, values.named(args.array, "--array"), **_options(args))


def _cmd_joblib(args: argparse.Namespace) -> None:
    fields = tuple(name.strip() for name in args.fields.split(","))
    if len(fields) != 2 or not all(fields) or fields[0] == fields[1]:
        raise SystemExit(f"error: --fields takes two different names, e.g. x,y, got {args.fields!r}")
    build_joblib(args.folder, args.out, fields=fields, batch_size=args.batch_size,  # type: ignore[arg-type]
                 lists=args.lists, classes=_classes(args), **_options(args))


def _cmd_files(args: argparse.Namespace) -> None:
    build_sample_files(args.root, args.labels, args.partition, args.out, classes=_classes(args), **_options(args))


def _cmd_folder(args: argparse.Namespace) -> None:
    build_folder(args.folder, args.out, recursive=args.recursive, **_options(args))


def _cmd_imagefolder(args: argparse.Namespace) -> None:
    if args.quality is not None and args.max_side is None:  # (told in the options' own names)
        raise ValueError(f"--quality {args.quality} is the JPEG quality of the images --max-side shrinks: give "
                         f"--max-side too (without it, images are stored as they are)")
    build_imagefolder(args.root, args.out, max_side=args.max_side, quality=args.quality, classes=_classes(args),
                      **_options(args))


def _classes_option(command: argparse.ArgumentParser, found: str) -> None:
    """``--classes A,B,C``: the class list labels that are names number, in place of the ``found``
    names sorted, so that a later set (a test folder lacking a class, a week adding one) is
    numbered as the first was."""
    command.add_argument("--classes", metavar="A,B,C", help=f"the class list labels number (default: {found}, "
                                                            f"sorted), e.g. the training set's metadata['classes']")


def _classes(args: argparse.Namespace) -> list[str] | None:
    """The names ``--classes`` lists (``None`` where it was not given)."""
    return None if args.classes is None else [name.strip() for name in args.classes.split(",")]


def _table_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"columns": args.columns, "fill": values.named(args.fill, "--fill"), **_options(args)}


def _cmd_parquet(args: argparse.Namespace) -> None:
    build_parquet(args.inputs, args.out, **_table_options(args))


def _cmd_arrow(args: argparse.Namespace) -> None:
    build_arrow(args.inputs, args.out, **_table_options(args))


def _cmd_index(args: argparse.Namespace) -> None:
    index_shards(args.shards, args.output, workers=args.workers, engine=args.engine, scheduler=args.scheduler,
                 overwrite=args.overwrite, quiet=args.quiet)


def _cmd_merge(args: argparse.Namespace) -> None:
    index, path = merge_index_files(args.parts, args.output, args.overwrite)
    print(f"merged {len(index.shards)} shards, {index.samples} samples -> {path}")


_INDEX_HELP = "index.json, its folder, or a URL (https://..., s3://bucket/prefix)"


def _cmd_inspect(args: argparse.Namespace) -> None:
    for part in describe_parts(args.index, args.samples):  # the index's summary, even if the samples fail
        print(part, flush=True)


def _cmd_verify(args: argparse.Namespace) -> int:
    """Verify's report, all on stdout, in the order found: a line a file (``--quiet``: only the
    files with a problem), then the result line; for a folder of splits, each split's."""
    def report(status: str, shown: str, problem: Problem | None) -> None:
        if problem is not None or not args.quiet or status == NOTE:
            print(f"{status:<4} {problem or shown}", flush=True)

    failed = 0
    for outcome in check_sets(args.index, report, args.images, on_set=lambda shown: print(f"== {shown}", flush=True)):
        print(outcome, flush=True)
        failed += bool(outcome.problems)
    return 1 if failed else 0


def _command(commands: Any, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` ends with examples (and whose own usage, not the top-level
    one, goes with an option it does not take: see :func:`main`)."""
    sub = commands.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              epilog="examples:\n" + epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.set_defaults(command_parser=sub)
    return sub


def _table_command(sub: argparse.ArgumentParser, inputs: str, run: Callable[[argparse.Namespace], None]) -> None:
    """The arguments of a build from tables (a row a sample, a column a field)."""
    sub.add_argument("inputs", nargs="+", metavar="FILE_OR_FOLDER", help=inputs)
    sub.add_argument("out", help="output folder or s3://bucket/prefix")
    sub.add_argument("--columns", type=values.names, metavar="A,B", help="the columns to build, in this order (default: all of them)")
    sub.add_argument("--fill", type=values.fill, action="append", default=[], metavar="COL=VALUE",
                     help="store VALUE where COL is null (a number when it reads as one; repeatable); a null "
                          "without a fill is an error")
    sub.set_defaults(run=run)
    _build_options(sub)


def _add_build_commands(commands: Any) -> None:
    build = commands.add_parser("build", help="write shards and an index from data in an existing layout",
                                description="Write shards and an index from data in an existing layout; "
                                            "'pipeline build LAYOUT --help' for each.")
    layouts = build.add_subparsers(dest="layout", required=True, metavar="LAYOUT", help="the layout of the data")
    arrays = _command(layouts, "arrays", "from .npy files (one per field) or an .npz",
                      "  pipeline build arrays shards --array x=features.npy --array y=labels.npy --validation 0.1\n"
                      "  pipeline build arrays shards --npz data.npz --dtype x=float32 --workers 4")
    arrays.add_argument("out", help="output folder or s3://bucket/prefix")
    arrays.add_argument("--array", type=values.pair("NAME=PATH"), action="append", default=[], metavar="NAME=PATH",
                        help="a field and its .npy file (repeat for each field)")
    arrays.add_argument("--npz", help="an .npz file: every array in it is a field")
    arrays.set_defaults(run=_cmd_arrays)
    joblib = _command(layouts, "joblib", "from x_<B>.job / y_<B>.job batch files (trusted input only: pickles)",
                      "  pipeline build joblib out/ shards --validation 0.1          # writes shards/train, "
                      "shards/validation\n"
                      "  pipeline build joblib out/ shards --batch-size 36 --dtype x=float32")
    joblib.add_argument("folder", help="folder holding the x_<B>.job and y_<B>.job files")
    joblib.add_argument("out", help="output folder or s3://bucket/prefix")
    joblib.add_argument("--fields", default="x,y", help="names of the two fields (default x,y)")
    joblib.add_argument("--batch-size", type=values.positive, metavar="B",
                        help="convert only x_B.job / y_B.job (a folder with files of several batch sizes holds "
                             "several copies of the data)")
    joblib.add_argument("--lists", choices=LISTS,
                        help="how a list of arrays that are not batches of B rows is read: each array a batch of "
                             "samples, or one sample (labels that are arrays: one-hot rows, a sequence's tags)")
    _classes_option(joblib, "the class names found in the y files")
    joblib.set_defaults(run=_cmd_joblib)
    files = _command(layouts, "files", "from one <root>/<ID>.pt or .npy file per sample, with labels and a partition",
                     "  pipeline build files data/ shards --labels labels.json --partition partition.json\n"
                     "  # writes shards/<split>/ for each split of the partition, e.g. shards/train, "
                     "shards/validation")
    files.add_argument("root", help="folder holding <ID>.pt (torch.save'd tensors) or <ID>.npy files")
    files.add_argument("out", help="output folder (one subfolder per split) or s3://bucket/prefix")
    files.add_argument("--labels", required=True, metavar="JSON", help='JSON file {"ID": label}')
    files.add_argument("--partition", required=True, metavar="JSON",
                       help='JSON file {"train": [IDs], "validation": [IDs]} (any split names)')
    _classes_option(files, "the class names the labels hold")
    files.set_defaults(run=_cmd_files)
    folder = _command(layouts, "folder", "from files grouped by stem (0001.jpg + 0001.json -> one sample)",
                      "  pipeline build folder images/ shards --validation 0.05\n"
                      "  pipeline build folder images/ shards --recursive --shard-bytes 1GiB")
    folder.add_argument("folder", help="folder of files named <key>.<field>")
    folder.add_argument("out", help="output folder or s3://bucket/prefix")
    folder.add_argument("--recursive", action="store_true", help="include subfolders (their path joins the key)")
    folder.set_defaults(run=_cmd_folder)
    images = _command(layouts, "imagefolder", "from ROOT/<class>/<image>.jpg (.jpeg, .png, .webp), as torchvision's "
                                              "ImageFolder reads them: the bytes, and a label",
                      "  pipeline build imagefolder photos/ shards --validation 0.05\n"
                      "  pipeline build imagefolder imagenet/ shards --max-side 512   # imagenet/train + imagenet/val")
    images.add_argument("root", help="folder of class folders, or of train/ and val/ folders of class folders")
    images.add_argument("out", help="output folder (train/ and validation/ in it for a split) or s3://bucket/prefix")
    images.add_argument("--max-side", type=values.positive, metavar="PIXELS",
                        help="shrink images whose longer side is larger, re-encoded as JPEG (default: bytes kept)")
    images.add_argument("--quality", type=values.percent,
                        help="JPEG quality of the images --max-side shrinks (default 90)")
    _classes_option(images, "the class folders found")
    images.set_defaults(run=_cmd_imagefolder)
    parquet = _command(layouts, "parquet", "from Parquet files: a row is a sample, a column a field (needs pyarrow)",
                       "  pipeline build parquet table.parquet shards --validation 0.1\n"
                       "  pipeline build parquet parts/ shards --columns embedding,label --fill label=-1 --workers 4")
    _table_command(parquet, "Parquet files, or folders of *.parquet files (read in name order)", _cmd_parquet)
    arrow = _command(layouts, "arrow", "from Arrow IPC files or streams, or a datasets save_to_disk folder "
                                       "(needs pyarrow)",
                     "  pipeline build arrow table.arrow shards --validation 0.1\n"
                     "  pipeline build arrow saved/ shards --columns embedding,label   # Dataset.save_to_disk('saved')")
    _table_command(arrow, "Arrow IPC files (.arrow, .feather) or streams, or folders of them (a save_to_disk "
                          "folder is read in the order of its state.json)", _cmd_arrow)
    for sub in (arrays, joblib, folder, images):
        _build_options(sub)
    _build_options(files, splits=False)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__,
                                     epilog="'pipeline COMMAND --help' shows a command's options and examples; "
                                            "'python -m pipeline' works as well.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")
    _add_build_commands(commands)

    index = _command(commands, "index", "index shards written by other tools in place (webdataset, tar): exact "
                                        "epochs, ranged reads and checksums without rewriting a byte",
                     "  pipeline index 'shards/train-{000000..000099}.tar'        # writes shards/index.json\n"
                     "  pipeline index https://data.example.org/shards/train-{000000..000099}.tar --output train/\n"
                     "  pipeline index s3://bucket/shards/ --workers 8             # the .tar files directly in it")
    index.add_argument("shards", nargs="+", help="shard files, brace patterns, folders of .tar files, or URLs")
    index.add_argument("--output", metavar="PATH", help="the index to write: a folder or DIR/index.json (default: "
                                                       "index.json in the shards' folder)")
    index.add_argument("--workers", type=values.positive, default=1, metavar="N",
                       help="shards scanned at once, in processes")
    index.add_argument("--engine", choices=ENGINES, default="local",
                       help="what scans the shards: local processes (default) or a Dask cluster")
    index.add_argument("--scheduler", metavar="ADDRESS", help="with --engine dask: the cluster's scheduler")
    index.add_argument("--overwrite", action="store_true", help="replace an index already there")
    index.add_argument("--quiet", action="store_true", help="no progress or summary")
    index.set_defaults(run=_cmd_index)

    merge = _command(commands, "merge-index", "join the partial indexes of a build made in parts (--part I/N)",
                     "  pipeline merge-index /shared/out                       # index.part-*.json -> index.json\n"
                     "  pipeline merge-index m0/ m1/ --output all/index.json   # parts built in several folders")
    merge.add_argument("parts", nargs="+", help="partial index files, or folders (or s3:// prefixes) holding them")
    merge.add_argument("--output", help="index to write (default: index.json beside the first part)")
    merge.add_argument("--overwrite", action="store_true", help="replace an index already at --output")
    merge.set_defaults(run=_cmd_merge)

    inspect = _command(commands, "inspect", "show a shard set's schema, counts, sizes and first samples",
                       "  pipeline inspect shards/train\n"
                       "  pipeline inspect s3://my-bucket/shards/train --samples 0")
    inspect.add_argument("index", help=_INDEX_HELP)
    inspect.add_argument("--samples", type=values.count, default=3, metavar="N",
                         help="decoded samples to show (default 3)")
    inspect.set_defaults(run=_cmd_inspect)

    check = _command(commands, "verify", "check every shard against the index (size, sha256, records, checksums)",
                     "  pipeline verify shards/train          # exit 1 and one line per broken shard\n"
                     "  pipeline verify https://data.example.org/shards/train/index.json --quiet\n"
                     "  pipeline verify shards/photos/train --images   # and decode every image")
    check.add_argument("index", help=_INDEX_HELP)
    check.add_argument("--quiet", action="store_true", help="print only the files with a problem and the result, "
                                                            "not each shard")
    check.add_argument("--images", action="store_true", help="also decode every image, as the loader will (a file cut "
                                                             "short or damaged passes the build and the checksums)")
    check.set_defaults(run=_cmd_verify)

    tune = _command(commands, "tune", "measure num_workers and prefetch_factor on these shards and this machine, "
                                      "and print the make_loader call to use",
                    "  pipeline tune shards/train                    # about half a minute\n"
                    "  pipeline tune s3://bucket/train --step-ms 40 --plot tune.png")
    add_tune_arguments(tune, "what make_loader takes: " + _INDEX_HELP)
    return parser


def _show_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """A warning of a command as a line of its own: the Python line it points at (the command's
    entry point) means nothing to a user of the command."""
    print(f"warning: {message}", file=sys.stderr)


#: The status of a command whose reader left: 128 + SIGPIPE, as a shell tool's that the signal ended.
READER_LEFT = 141


def _drop_stdout() -> None:
    """Send what is left of standard output nowhere: Python would otherwise fail again to flush
    it to the reader gone, at exit, with a traceback."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # not a file (captured in-process)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the command's own streams, not an in-process caller's: what they cannot encode, escaped
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper) and not stream.closed:
                stream.reconfigure(errors="backslashreplace")
    parser = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told with the usage of the command they follow
        after_command = argv.index(unknown[0]) > argv.index(args.command)
        (args.command_parser if after_command else parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    run: Callable[[argparse.Namespace], int | None] = args.run
    build_end = BuildEnd(args)
    try:
        with warnings.catch_warnings(), reliable_ctrl_c():
            warnings.showwarning = _show_warning
            code = run(args) or 0
        if sys.stdout is not None:  # (None where it was closed: cmd >&-, a daemon's)
            sys.stdout.flush()  # output still buffered goes now: a reader gone is seen here, not at exit
        return code
    except BrokenPipeError:  # the reader of the output left (pipeline verify DIR | head): end quietly
        _drop_stdout()
        return READER_LEFT
    except OutputExistsError as exc:
        print(f"error: {values.options_first(str(exc))}", file=sys.stderr)
        return 1
    except (FormatError, OSError, ValueError, ImportError) as exc:
        after = "" if isinstance(exc, InputChanged) else build_end.after_failure()
        print(f"error: {values.options_first(str(exc))}{after}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted{build_end.after_interrupt()}", file=sys.stderr)
        return 130
