"""The ``pipeline tune`` command: its options, and the run that prints the table and the
``make_loader`` call to use."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import cli_values as values


def add_tune_arguments(parser: argparse.ArgumentParser, data_help: str) -> None:
    parser.add_argument("data", help=data_help)
    parser.add_argument("--batch-size", type=values.positive, default=256, metavar="N",
                        help="as make_loader's (default 256)")
    parser.add_argument("--workers", type=values.counts(0), metavar="N,N",
                        help="numbers of workers to try (default: 0, 1, 2, 4, ... up to the usable cores)")
    parser.add_argument("--prefetch", type=values.counts(1), metavar="N,N",
                        help="prefetch factors to try at the best number of workers (default: 1,4, besides 2)")
    parser.add_argument("--step-ms", type=values.finite_number(positive=False), default=0.0,
                        help="a simulated training step per batch, in ms")
    parser.add_argument("--seconds", type=values.finite_number(positive=True), default=3.0,
                        help="seconds each setting is measured (default 3)")
    parser.add_argument("--memory-mb", type=values.finite_number(positive=True),
                        help="leave out settings whose peak memory is above this")
    parser.add_argument("--shuffle-buffer", type=values.positive, metavar="SAMPLES",
                        help="as make_loader's shuffle_buffer")
    parser.add_argument("--images", type=values.image_field, action="append", default=[], metavar="FIELD=SIZE",
                        help="decode FIELD's images to SIZE x SIZE in the workers, as Images(SIZE) (repeatable)")
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                        help="as make_loader's on_error: skip records that fail their checks (a damaged image)")
    parser.add_argument("--fields", type=values.names, metavar="A,B",
                        help="as make_loader's fields: read only these (the fields of the shards' first record without "
                             "an index, unless given)")
    parser.add_argument("--fill", type=values.fill, action="append", default=[], metavar="FIELD=VALUE",
                        help="as make_loader's fill, for a field some samples lack: VALUE as JSON (0, -1.5, null, "
                             "\"text\"), else the text as typed (repeatable)")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="as make_loader's cache_dir: remote shards are read whole into DIR (for a server "
                             "without Range requests), and the measuring reads them there")
    parser.add_argument("--plot", metavar="FILE.png", help="also save a chart of the settings (needs matplotlib)")
    parser.set_defaults(run=_cmd_tune)


def _cmd_tune(args: argparse.Namespace) -> int:
    from .measure.tune import check_plot, tune

    if args.plot:
        try:  # before measuring: a chart that cannot be saved would throw the run away at its end
            check_plot(args.plot)
        except (OSError, ValueError) as exc:  # the folder, or the kind of file
            print(f"error: --plot {exc}", file=sys.stderr)
            return 1
    options: dict[str, Any] = {"on_error": "skip"} if args.on_error == "skip" else {}
    if args.shuffle_buffer is not None:
        options["shuffle_buffer"] = args.shuffle_buffer
    if args.fields:
        options["fields"] = args.fields
    if args.fill:
        options["fill"] = {field: values.json_or_text(value) for field, value in values.named(args.fill, "--fill").items()}
    if args.cache_dir:
        options["cache_dir"] = args.cache_dir
    if args.images:
        from .stream.images import Images

        options["images"] = {field: Images(size) for field, size in values.named(args.images, "--images").items()}
    try:
        result = tune(args.data, batch_size=args.batch_size, workers=args.workers, prefetch=args.prefetch,
                      step_ms=args.step_ms, seconds=args.seconds, memory_mb=args.memory_mb, options=options,
                      progress=lambda line: print(line, file=sys.stderr))
    except (RuntimeError, ValueError) as exc:  # a setting's run failed (its error output says why), or bad values
        from .stream.options import SKIP_HINT

        print(f"error: {str(exc).replace(SKIP_HINT, 'add --on-error skip')}", file=sys.stderr)
        return 1
    print(result.table())  # also when nothing fits the memory budget: what was measured says by how much
    if args.plot:
        result.plot(args.plot)
        print(f"chart saved to {args.plot}")
    try:
        call = result.call()
    except ValueError as exc:  # nothing within --memory-mb
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"\nrecommended: {call}")
    return 0
