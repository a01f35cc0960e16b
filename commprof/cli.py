"""The ``commprof`` command line (``python -m commprof`` is the same)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional, Sequence

from . import __version__
from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


def _face_options(p) -> None:
    """How text tables are laid out (report, model, diff)."""
    g = p.add_argument_group("terminal output")
    g.add_argument("--plain", action="store_true", help="plain text, no colours (the default when not a terminal)")
    g.add_argument("--wide", action="store_true", help="never split a table to fit the terminal width")
    g.add_argument("--width", type=int, default=None, metavar="N",
                   help="fit tables into N columns (default: the terminal's width; unlimited when not a terminal)")
    g.add_argument("--columns", default=None, metavar="LIST",
                   help="only these columns (keys or headers, comma-separated; the key columns always show)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="commprof", description="Where distributed training spends its time.")
    p.add_argument("--version", action="version", version=f"commprof {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    _add_record_parser(sub)
    _add_merge_parser(sub)
    _add_report_parser(sub)
    _add_model_parser(sub)
    _add_export_parser(sub)
    _add_diff_parser(sub)
    _add_bench_parser(sub)
    _add_import_parser(sub)
    _add_predict_parser(sub)
    _add_sweep_parser(sub)
    return p


def _add_record_parser(sub) -> None:
    """``commprof record``'s options: the launcher's own here, the
    recorder's generated from its Config fields (commprof/record/config.py)."""
    from .record.config import add_options

    r = sub.add_parser("record", help="run a command and record every rank",
                       description="Run CMD unchanged; every Python process it starts that trains "
                                   "writes a per-rank trace; the shards are merged into DIR/trace.parquet.")
    r.add_argument("-o", "--output", metavar="DIR", default=None,
                   help="output folder (default: ./commprof-YYYYmmdd-HHMMSS)")
    r.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="launch CMD's script through torchrun with N processes")
    r.add_argument("--keep-shards", action="store_true", help="keep per-rank shards after merging")
    r.add_argument("--horovod-timeline", action="store_true",
                   help="also turn on HOROVOD_TIMELINE and merge its phases (negotiation, fusion, "
                        "transfers) into the trace")
    r.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="this is one of N 'commprof record' writing one shared folder (one per node); "
                        "the last to finish merges (default: inferred from srun / torchrun --nnodes)")
    r.add_argument("--run-id", default=None, metavar="ID",
                   help="the job's id, the same on every node (default: from Slurm or torchrun's "
                        "rendezvous; per-node folders with one id are reported as one job)")
    r.add_argument("--hang-timeout", type=float, default=0.0, metavar="S",
                   help="when no rank has made progress for S seconds, write hang.json / hang.txt: where "
                        "every rank is, whom the others wait for, every thread's stack")
    r.add_argument("--hang-kill", action="store_true",
                   help="with --hang-timeout: then end the job (commprof exits with status 124)")
    add_options(r)
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def _add_merge_parser(sub) -> None:
    """``commprof merge``'s options."""
    mg = sub.add_parser("merge", help="merge a record folder's shards by hand",
                        description="Merge the shards and journals of a record folder into DIR/trace.parquet "
                                    "(a shared multi-node folder whose last participant died before merging).")
    mg.add_argument("folder", metavar="DIR")
    mg.add_argument("--force", action="store_true", help="merge even if participants look unfinished")


def _add_report_parser(sub) -> None:
    """``commprof report``'s options."""
    rep = sub.add_parser("report", help="tables from one or more traces",
                         description="Breakdown per GPU count and configuration, throughput, collectives.")
    rep.add_argument("traces", nargs="+", metavar="TRACE",
                     help="trace.parquet, a record folder, or a folder of shards (several runs allowed)")
    from .render import FORMATS

    rep.add_argument("--format", choices=FORMATS, default=None,
                     help="output format (default: table, or from -o's extension)")
    rep.add_argument("-o", "--output", metavar="FILE", default=None, help="write to FILE instead of stdout")
    rep.add_argument("--table", metavar="NAME", default=None,
                     help="only this table (breakdown, study, collectives, skew, stragglers, nodes, clocks, ...); "
                          "--format csv writes one table: this one, or the breakdown")
    rep.add_argument("--out-dir", metavar="DIR", default=None,
                     help="also write every format into DIR (report.txt/.md/.json/.html, one CSV per table)")
    rep.add_argument("--batch-size", type=int, default=None,
                     help="per-rank batch size (default: inferred from the model's input)")
    rep.add_argument("--warmup", type=int, default=1, metavar="K",
                     help="leave out the first K steps of every rank (default 1)")
    rep.add_argument("--group-by", default=None, metavar="KEYS",
                     help="comma-separated metadata keys that define a configuration "
                          "(default: framework,loader,model,batch_size + labels)")
    rep.add_argument("--timings", action="store_true",
                     help="print the seconds spent per analysis stage to stderr (to find a slow stage), and "
                          "whether the compiled analysis kernels or numpy ran (and why)")
    rep.add_argument("--peak-tflops", type=float, default=None, metavar="T",
                     help="the GPU's peak TFLOP/s for MFU (default: a table of common GPUs by device name)")
    _face_options(rep)


def _add_model_parser(sub) -> None:
    """``commprof model``'s options."""
    from .render import FORMATS

    md = sub.add_parser("model", help="collective cost model: fit, validate, predict to other GPU counts",
                        description="INPUT: traces (training runs, commprof bench -o traces), commprof bench "
                                    "--json results or nccl-tests logs (one per measured N). With --to, or any "
                                    "input not a trace: fit the NCCL-style cost model (Ring / Tree, protocols; "
                                    "gloo: ring), choose its form by leaving one measured N out, and print the "
                                    "measured and predicted collectives. Traces alone without --to: the "
                                    "alpha-beta fit T(S) = alpha + S / beta per collective; with --against, "
                                    "its agreement with another model.")
    md.add_argument("traces", nargs="+", metavar="INPUT")
    md.add_argument("--to", default=None, metavar="LIST", help="rank counts to predict, e.g. 64,256,1024")
    md.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                    help="ranks per node of the predictions (default: as measured)")
    md.add_argument("--op", default=None, help="the collective of nccl-tests logs that do not say")
    md.add_argument("--network", default=None, metavar="SPEC",
                    help="terms the measurements cannot see: bw=25GB/s,latency=5us[,intra_bw=...,intra_latency=...]")
    md.add_argument("-o", "--output", default=None, metavar="FILE", help="write the report to FILE")
    md.add_argument("--table", metavar="NAME", default=None)
    md.add_argument("--against", action="append", default=[], metavar="MODEL",
                    help="a model JSON (commprof bench --model) or a trace to compare with (repeatable)")
    md.add_argument("--json", metavar="FILE", default=None, help="write the first trace's fitted model (JSON)")
    md.add_argument("--format", choices=FORMATS, default="table")
    _face_options(md)


def _add_export_parser(sub) -> None:
    """``commprof export``'s options."""
    ex = sub.add_parser("export", help="write a timeline for other viewers")
    esub = ex.add_subparsers(dest="format", parser_class=_Parser)
    ch = esub.add_parser("chrome", help="Perfetto / chrome://tracing JSON (Kineto layout, HTA-loadable)",
                         description="One merged multi-rank timeline (or one file per rank with --per-rank).")
    ch.add_argument("trace", metavar="TRACE")
    ch.add_argument("-o", "--output", required=True, metavar="FILE", help="timeline.json or timeline.json.gz")
    ch.add_argument("--steps", default=None, metavar="A:B", help="only steps A..B (inclusive)")
    ch.add_argument("--ranks", default=None, metavar="LIST", help="only these ranks, e.g. 0,1,4-7")
    ch.add_argument("--per-rank", action="store_true", help="one file per rank (FILE.rank<R>.json[.gz])")


def _add_diff_parser(sub) -> None:
    """``commprof diff``'s options."""
    from .render import FORMATS

    df = sub.add_parser("diff", help="what grew or shrank between two runs",
                        description="Per category and per collective: A, B, B - A and the change in %.")
    df.add_argument("a", metavar="A")
    df.add_argument("b", metavar="B")
    df.add_argument("--format", choices=FORMATS, default="table")
    df.add_argument("--warmup", type=int, default=1)
    _face_options(df)


def _add_bench_parser(sub) -> None:
    """``commprof bench``'s options."""
    from .render import FORMATS

    bn = sub.add_parser("bench", help="collective micro-benchmark (nccl-tests table, alpha-beta model)",
                        description="Time all_reduce, reduce_scatter, all_gather, broadcast and all_to_all "
                                    "by message size on every rank of a torch.distributed job (gloo, NCCL); "
                                    "print the nccl-tests table.")
    bn.add_argument("--nproc", type=int, default=None, metavar="N", help="run N local ranks through torchrun")
    bn.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather,broadcast,all_to_all")
    bn.add_argument("--min-bytes", type=_size, default=8, metavar="S")
    bn.add_argument("--max-bytes", type=_size, default=0, metavar="S",
                    help="largest message (default 64M on CPU, 4G on GPU); K/M/G suffixes")
    bn.add_argument("--dtypes", default="float32", help="comma-separated torch dtypes")
    bn.add_argument("--warmup", type=int, default=5)
    bn.add_argument("--iters", type=int, default=20)
    bn.add_argument("--overlap", action="store_true",
                    help="also measure a non-blocking all_reduce overlapped with compute (OSU-style)")
    bn.add_argument("--pipeline", action="store_true",
                    help="also split the largest all_reduces into k = 1..64 async chunks")
    bn.add_argument("--pairs", action="store_true",
                    help="instead of the collectives: point-to-point bandwidth and latency between every pair of "
                         "nodes (a round-robin tournament: no two pairs of a round share a node), then inside "
                         "each node; names a slow node or link")
    bn.add_argument("--pairs-bytes", type=_size, default=0, metavar="S",
                    help="with --pairs: bytes each way per exchange (default 4M on CPU, 256M on GPU)")
    bn.add_argument("--max-pairs", type=int, default=None, metavar="P",
                    help="with --pairs: measure at most P node pairs (whole rounds, chosen at random: every "
                         "node still measured equally often)")
    bn.add_argument("--format", choices=FORMATS, default="table", help="with --pairs: the report's format")
    bn.add_argument("--report", metavar="FILE", default=None,
                    help="with --pairs: also write the report (format by extension: .html has the heat map)")
    bn.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON")
    bn.add_argument("--model", metavar="FILE", default=None, help="fit and write the alpha-beta model")
    bn.add_argument("-o", "--output", metavar="DIR", default=None,
                    help="also write every timed call as a commprof trace (DIR/trace.parquet, source 'bench') "
                         "that report and model read like any run")
    bn.add_argument("cmd", nargs=argparse.REMAINDER, help="-- LAUNCHER [ARGS...] (instead of --nproc)")


def _add_import_parser(sub) -> None:
    """``commprof import``'s options."""
    imp = sub.add_parser("import", help="convert other profilers' traces into a commprof trace")
    isub = imp.add_subparsers(dest="format", parser_class=_Parser)
    kin = isub.add_parser("kineto", help="PyTorch-profiler (Kineto) JSON traces, one per rank",
                          description="Convert per-rank PyTorch-profiler JSON (.json/.json.gz, with "
                                      "distributedInfo) into one commprof trace.")
    kin.add_argument("inputs", nargs="+", metavar="DIR_OR_FILE")
    kin.add_argument("-o", "--output", required=True, metavar="TRACE", help="output .parquet")
    kin.add_argument("--rank", type=int, default=None,
                     help="rank of a single trace without distributedInfo (single-GPU traces)")
    kin.add_argument("--workers", type=int, default=None, metavar="N",
                     help="convert N rank files at a time in worker processes (default: the cores)")
    kin.add_argument("--dask", default=None, metavar="ADDRESS",
                     help="run the per-rank conversions as tasks on this Dask scheduler (tcp://host:8786); "
                          "the workers must see the input files and the output folder")
    nt = isub.add_parser("nccl-tests", help="nccl-tests logs (all_reduce_perf & co.) as benchmark results",
                         description="Read nccl-tests' text output into commprof bench's JSON form "
                                     "(and an alpha-beta model with --model).")
    nt.add_argument("inputs", nargs="+", metavar="LOG")
    nt.add_argument("-o", "--output", default=None, metavar="FILE", help="results JSON (default: print the table)")
    nt.add_argument("--model", default=None, metavar="FILE", help="fit and write the alpha-beta model")
    nt.add_argument("--op", default=None, help="the collective, when the log does not say")


def _add_predict_parser(sub) -> None:
    """``commprof predict``'s options."""
    from .render import FORMATS

    pr = sub.add_parser("predict", help="extend a study to GPU counts nobody ran (trace-driven replay)",
                        description="Replay measured steps (data, forward, backward with each bucket's ready "
                                    "instant, optimizer) with communication times for N ranks from a bench "
                                    "model, a described network, or an alpha-beta model fitted to the measured "
                                    "collectives. --validate predicts each measured size from the others.")
    pr.add_argument("traces", nargs="+", metavar="RUN", help="record folders, traces or a study folder")
    pr.add_argument("--to", default=None, metavar="LIST", help="GPU counts to predict, e.g. 8,16,32,64,1024")
    pr.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                    help="weak: per-rank batch fixed (default); strong: global batch fixed")
    pr.add_argument("--what-if", action="append", default=[], metavar="KEY=VALUE",
                    help="bucket_cap_mb=100, bandwidth=2x, latency=0.5x, overlap=off (repeatable)")
    pr.add_argument("--bench", default=None, metavar="MODEL.json", help="a commprof bench --model file")
    pr.add_argument("--network", default=None, metavar="SPEC",
                    help="bw=25GB/s,latency=5us[,gpus_per_node=8,intra_bw=150GB/s,intra_latency=2us]")
    pr.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                    help="ranks per node for a fitted model's intra/inter split (default: as measured)")
    pr.add_argument("--validate", action="store_true", help="also predict each measured size from the others")
    pr.add_argument("--warmup", type=int, default=1)
    pr.add_argument("--steps", type=int, default=60, help="simulated steps per replay")
    pr.add_argument("--reps", type=int, default=24, help="replays (for the mean and the interval)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--format", choices=FORMATS, default=None)
    pr.add_argument("-o", "--output", metavar="FILE", default=None)
    pr.add_argument("--table", metavar="NAME", default=None)
    _face_options(pr)


def _add_sweep_parser(sub) -> None:
    """``commprof sweep``'s options."""
    sw = sub.add_parser("sweep", help="run a scaling study: every configuration x GPU count under record",
                        description="Run each (configuration, N) cell under commprof record into "
                                    "STUDY/<configuration>/<N>/ (locally, or one SLURM job per cell), skip "
                                    "complete cells, keep going past failing ones, then print the study report. "
                                    "The command template takes {nproc}, {nodes}, {tasks_per_node}, "
                                    "{gpus_per_node}, {cell} and every --vary key.")
    sw.add_argument("plan", nargs="?", default=None, metavar="PLAN.toml",
                    help="a study plan (see docs/sweep-predict.md)")
    sw.add_argument("-o", "--output", default=None, metavar="STUDY", help="the study folder (default: study)")
    sw.add_argument("--nproc", default=None, metavar="LIST", help="GPU counts, e.g. 1,2,4,8")
    sw.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                    help="a configuration key and its values (repeatable)")
    sw.add_argument("--launcher", choices=("local", "slurm"), default=None)
    sw.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                    help="SLURM layout: nodes = ceil(N / G), tasks per node = min(N, G)")
    sw.add_argument("--partition", default=None)
    sw.add_argument("--time", default=None, metavar="HH:MM:SS", help="SLURM time limit per cell")
    sw.add_argument("--sbatch-args", default=None, metavar="ARGS", help="extra #SBATCH arguments (one string)")
    sw.add_argument("--record-args", default=None, metavar="ARGS", help="extra commprof record options (one string)")
    sw.add_argument("--cell-timeout", type=float, default=None, metavar="S",
                    help="stop a cell running longer than S seconds (marked failed)")
    sw.add_argument("--pairs", action="store_true",
                    help="first measure every node pair alone (commprof bench --pairs over the largest cell's "
                         "ranks) into STUDY/pairs/; the study report shows its findings")
    sw.add_argument("--dry-run", action="store_true", help="print each cell's command or job script; run nothing")
    sw.add_argument("--force", action="store_true", help="rerun complete cells too")
    sw.add_argument("--no-report", action="store_true", help="do not print the study report at the end")
    _face_options(sw)



def _two_malloc_arenas() -> None:
    """glibc gives threads that allocate their own heaps ("arenas") and keeps
    each one's freed memory; the report's reading and sweeping threads
    share two instead (a 10 M-event report: about 10 % less resident
    memory at the same speed, benchmarks/results/report_speed/). Only this
    process: a launched job is a process of its own. Elsewhere a no-op."""
    _mallopt((-8, 2))       # M_ARENA_MAX


def _keep_heap() -> None:
    """glibc hands blocks past a threshold it raises as they are freed (up
    to 32 MiB) straight to mmap, and gives the heap's free top back past
    twice that: a report's chunk-sized arrays are then faulted in afresh,
    chunk after chunk. Fixed thresholds keep them (mmap from 32 MiB, the
    top given back past 1 GiB, grown 64 MiB at a time); the stages still
    give the free heap back between them, past 512 MiB (analyzers/run.py).
    A 10 M-event report: 0.16 s less system CPU, 0.05-0.07 s sooner, 20-25
    MiB more at its peak (benchmarks/results/report_speed/). Elsewhere a
    no-op. They last as long as the process (glibc's own thresholds cannot
    be had back), so only a process that ends with its command sets them
    (:func:`entry`, not a caller of :func:`main`)."""
    if not _ENDS_WITH_COMMAND:
        return
    _mallopt((-3, 32 << 20), (-1, 1 << 30), (-2, 64 << 20))     # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD


def _mallopt(*settings) -> None:
    """glibc's ``mallopt(param, value)`` for each pair; elsewhere a no-op."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        for param, value in settings:
            libc.mallopt(param, value)
    except (OSError, AttributeError):
        pass


#: set by a command whose work is all written and that holds nothing the
#: interpreter's teardown would still do anything with (:func:`entry`)
_DONE = False
#: the process ends when the command does (:func:`entry`): settings that
#: outlast a command (glibc's heap thresholds) may be made for it
_ENDS_WITH_COMMAND = False


def entry() -> None:
    """The ``commprof`` command (console script and ``python -m commprof``):
    :func:`main`, then the process ends. After a report, whose output is
    written and flushed, without the interpreter freeing its objects one by
    one (10 M events: ~70 ms, benchmarks/results/report_speed/)."""
    global _ENDS_WITH_COMMAND
    _ENDS_WITH_COMMAND = True
    rc = main()
    if _DONE and rc == 0:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):     # a closed pipe: the normal exit says so
            sys.exit(rc)
        os._exit(rc)
    sys.exit(rc)


def main(argv: Optional[List[str]] = None) -> int:
    global _DONE
    _DONE = False
    argv = sys.argv[1:] if argv is None else argv
    _two_malloc_arenas()
    parser = build_parser()
    try:
        if argv[:1] == ["sweep"]:  # the template after -- is not for argparse
            cut = argv.index("--") if "--" in argv else len(argv)
            args = parser.parse_args(argv[:cut])
            args.cmd = argv[cut + 1:]
        else:
            args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command == "record":
            return cmd_record(args)
        if args.command == "merge":
            return cmd_merge(args)
        if args.command == "model":
            return cmd_model(args)
        if args.command == "report":
            rc = cmd_report(args)
            _DONE = True
            return rc
        if args.command == "import":
            return cmd_import(args)
        if args.command == "export":
            return cmd_export(args)
        if args.command == "diff":
            return cmd_diff(args)
        if args.command == "sweep":
            return cmd_sweep(args)
        if args.command == "predict":
            return cmd_predict(args)
        if args.command == "bench":
            from .bench.launch import bench

            return bench(args)
        raise UsageError(f"unknown command {args.command}")
    except UsageError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `commprof ... | head`: the reader left
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        return _fail(str(exc) if not getattr(exc, "filename", None) else f"{exc.filename}: {exc.strerror}")
    except Exception as exc:  # never a traceback for the user
        from .trace.schema import TraceFormatError

        if isinstance(exc, TraceFormatError):
            return _fail(str(exc))
        if os.environ.get("COMMPROF_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (COMMPROF_DEBUG=1 shows the traceback)")


def _fail(msg: str) -> int:
    msg = msg.strip().splitlines()[0] if msg.strip() else "error"
    sys.stderr.write(f"commprof: error: {msg}\n")
    return 2


def cmd_record(args) -> int:
    from .record.config import from_options
    from .record.launcher import exit_like, record

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    out = args.output or time.strftime("commprof-%Y%m%d-%H%M%S")
    try:
        options = from_options(args)
    except ValueError as exc:
        raise UsageError(str(exc))
    rc = record(cmd, out, options, nproc=args.nproc, keep_shards=args.keep_shards,
                horovod_timeline=args.horovod_timeline, nodes=args.nodes, run_id=args.run_id,
                hang_timeout=args.hang_timeout, hang_kill=args.hang_kill)
    return exit_like(rc)


def cmd_model(args) -> int:
    import json

    from .api import fit_model, model
    from .trace.files import atomic_write

    from .costmodel import cost_model_report, is_measurement

    if args.to or args.network or args.gpus_per_node or any(is_measurement(p) for p in args.traces):
        report = cost_model_report(args.traces, to=args.to, gpus_per_node=args.gpus_per_node, op=args.op,
                                   network=args.network)
    else:
        report = model(args.traces, args.against)
    from . import render

    fmt = args.format if args.format != "table" or not args.output else (render.format_for_path(args.output)
                                                                         or "table")
    _write_report(report, args, fmt)
    if args.json:
        m = fit_model(args.traces[0])
        m.pop("pieces", None)
        atomic_write(args.json, json.dumps(m, indent=1, default=str))
    return 0


def cmd_merge(args) -> int:
    from .record.launcher import merge_folder

    merge_folder(args.folder, force=args.force)
    return 0


def cmd_import(args) -> int:
    if args.format == "nccl-tests":
        return cmd_import_nccl_tests(args)
    if args.format != "kineto":
        raise UsageError("commprof import: choose a format: kineto, nccl-tests")
    from .convert.kineto_import import import_kineto

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    from .progress import Bar

    with Bar("importing", None, "files") as bar:
        run = import_kineto(args.inputs, args.output, rank=args.rank, workers=args.workers or 0, dask=args.dask,
                            on_file=lambda done, total: (setattr(bar, "total", total), bar.advance(1)))
    sys.stderr.write(f"commprof: imported {run.get('ranks_recorded')} rank(s), world size "
                     f"{run.get('world_size')} -> {args.output}\n")
    return 0


def cmd_import_nccl_tests(args) -> int:
    import json

    from .bench.launch import model_of, model_table
    from .convert.nccltests import import_logs, table
    from .trace.files import atomic_write

    docs = import_logs(args.inputs, op=args.op)
    doc = {"backend": "nccl-tests", "world_size": docs[0].get("world_size"), "device": None,
           "source": ", ".join(d["source"] for d in docs), "rows": [r for d in docs for r in d["rows"]]}
    if args.output:
        atomic_write(args.output, json.dumps(doc, indent=1))
        sys.stderr.write(f"commprof: {len(doc['rows'])} size rows from {len(docs)} log(s) -> {args.output}\n")
    else:
        sys.stdout.write(table(doc))
    if args.model:
        model = model_of(doc)
        atomic_write(args.model, json.dumps(model, indent=1))
        sys.stdout.write(model_table(model))
    return 0


def _size(text: str) -> int:
    """'64M' -> 67108864 (K, M, G: powers of 1024)."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (e.g. 8, 64K, 64M, 4G)")


def _ints(spec: str):
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out += list(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise UsageError(f"--ranks expects a list like 0,1,4-7, got {spec!r}")
    return out


def _arrow_pool() -> None:
    """Commands that stream a trace use Arrow's jemalloc pool where it is
    built in: on the 10 M-event benchmark trace (benchmarks/report_speed.py)
    `commprof report` peaked at 963-984 MB with it and 1,082-1,105 MB with
    the default pool (two runs each, 2026-12-03), at the same speed within
    this machine's noise."""
    import pyarrow as pa

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):
        pass


#: settings the numerical libraries read once, as they load, for the report
#: (:func:`_load_quietly`)
_LOAD_SETTINGS = {
    # Arrow's pool from the start: the Parquet reader takes some buffers from
    # the pool that was the default when it was first used, whatever is set
    # later (a 10 M-event report: 254 MB through mimalloc beside jemalloc)
    "ARROW_DEFAULT_MEMORY_POOL": "jemalloc",
    # OpenBLAS's threads spin ~0.1 s of a core as numpy loads; the analyses
    # call no BLAS routine large enough to share out
    "OPENBLAS_NUM_THREADS": "1",
}


def _load_quietly() -> None:
    """For the report: numpy and pyarrow loaded with :data:`_LOAD_SETTINGS`
    (a setting the user made is kept), in a process that ends with its
    command and has not loaded them yet; the environment is then as it
    was, so that nothing launched later inherits them. On 2 cores, 10 M
    events, 10 alternated pairs: 0.05 s sooner (7 of 10), 0.16 s less CPU.
    Not for the Chrome export: with them it took 2 s more, 2.7 s more system
    CPU (3 pairs; benchmarks/results/report_speed/2026-12-06-aab9661.md).
    Linux only (the wheels there have jemalloc; Arrow warns of a pool it
    lacks)."""
    if not _ENDS_WITH_COMMAND or sys.platform != "linux" or "pyarrow" in sys.modules or "numpy" in sys.modules:
        return
    added = [k for k in _LOAD_SETTINGS if k not in os.environ]
    for k in added:
        os.environ[k] = _LOAD_SETTINGS[k]
    try:
        import numpy  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        pass
    finally:
        for k in added:
            os.environ.pop(k, None)


#: cores the report's own threads keep busy while it reads a trace (two
#: sweeping chunks, one folding their collectives, the main one,
#: analyzers/run.py: 1.8-1.9 cores of a 2-core machine)
_REPORT_CORES = 2


def _arrow_threads() -> int:
    """Arrow's CPU threads (decoding, conversions) set to the cores the
    report's own threads leave, at least one; returns the number before.
    On 2 cores, one decoding thread instead of two: 10 M events 0.07 s
    faster (8 of 10 pairs), 58 MiB less at the peak
    (benchmarks/results/report_speed/): a second one only contends with
    the sweeps."""
    import pyarrow as pa

    before = pa.cpu_count()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    pa.set_cpu_count(max(1, cores - _REPORT_CORES))
    return before


def cmd_export(args) -> int:
    _arrow_pool()
    if args.format != "chrome":
        raise UsageError("commprof export: choose a format: chrome")
    from .api import load
    from .convert.chrome import export_chrome

    steps = None
    if args.steps:
        try:
            a, _, b = args.steps.partition(":")
            steps = (int(a), int(b or a))
        except ValueError:
            raise UsageError(f"--steps expects A:B, got {args.steps!r}")
    ranks = _ints(args.ranks) if args.ranks else None
    from .progress import Bar

    with Bar("exporting", None, "ranks") as bar:
        paths = export_chrome(load(args.trace), args.output, steps=steps, ranks=ranks, per_rank=args.per_rank,
                              on_rank=lambda done, total: (setattr(bar, "total", total), bar.advance(1)),
                              warn=lambda text: sys.stderr.write(f"commprof: warning: {text}\n"))
    sys.stderr.write(f"commprof: wrote {', '.join(paths)}\n")
    return 0


def cmd_predict(args) -> int:
    from . import render
    from .predict import predict

    report = predict(args.traces, to=args.to, mode=args.scaling, what_if=args.what_if, bench=args.bench,
                     network=args.network, gpus_per_node=args.gpus_per_node, validate=args.validate,
                     warmup=args.warmup, steps=args.steps, reps=args.reps, seed=args.seed)
    fmt = args.format or (render.format_for_path(args.output) if args.output else None) or "table"
    _write_report(report, args, fmt)
    return 0


def _write_report(report, args, fmt: str) -> None:
    """``--table`` / ``--columns`` applied, rendered in ``fmt`` (csv: one
    table), written to ``-o`` or stdout."""
    from . import render
    from .trace.files import atomic_write

    shown = _select(report, args)
    text = (render.RENDERERS["csv"](table=args.table).render(shown) if fmt == "csv"
            else _renderer(args, fmt, to_file=bool(args.output)).render(shown))
    if args.output:
        atomic_write(args.output, text)
    else:
        sys.stdout.write(text)


def cmd_sweep(args) -> int:
    import shlex

    from .sweep import load_plan, sweep

    cmd = list(args.cmd)
    plan = load_plan(args.plan, command=shlex.join(cmd) if cmd else None, nproc=args.nproc, vary=args.vary,
                     output=args.output, launcher=args.launcher, gpus_per_node=args.gpus_per_node,
                     record_args=shlex.split(args.record_args) if args.record_args else None,
                     cell_timeout=args.cell_timeout, partition=args.partition, time=args.time,
                     sbatch_args=args.sbatch_args, pairs=args.pairs)
    rc = sweep(plan, force=args.force, dry_run=args.dry_run)
    if args.dry_run or args.no_report:
        return rc
    from .api import compare, study_runs

    runs = study_runs(plan.output)
    if runs:
        from dataclasses import replace

        report = compare(runs).report()
        report = replace(report, tables={k: v for k, v in report.tables.items() if k in ("breakdown", "study")},
                         notes=report.notes[:1] + [f"The whole report: commprof report {plan.output}"])
        sys.stdout.write("\n" + _renderer(args, "table").render(_select(report, argparse.Namespace(
            table=None, columns=args.columns))))
    from .analyzers.report import pairs_report
    from .api import study_pairs

    for where, doc in study_pairs([plan.output]):
        found = pairs_report(doc).tables["bottlenecks"].frame["finding"]
        sys.stdout.write(f"\nNode pairs ({where}, heat map: {where[:-len('.json')]}.html): {'; '.join(found)}\n")
    return rc


def cmd_diff(args) -> int:
    from .analyzers.report import diff_report
    from .api import diff

    report = diff_report(diff(args.a, args.b, warmup=args.warmup), args.a, args.b)
    sys.stdout.write(_renderer(args, args.format).render(_select(report, args)))
    return 0


def _renderer(args, fmt: str, to_file: bool = False):
    """The renderer for ``fmt``; text tables fit the terminal (rich, colours)
    when stdout is one, else plain and unsplit unless ``--width``."""
    from . import render

    if fmt != "table":
        return render.get(fmt)
    tty = not to_file and sys.stdout.isatty() and not args.plain
    width = None if args.wide else args.width
    if width is None and tty and not args.wide:
        import shutil

        width = shutil.get_terminal_size((100, 24)).columns
    return render.RENDERERS["table"](width=width, color=tty and "NO_COLOR" not in os.environ)


def _select(report, args):
    """``--table`` (one table) and ``--columns`` (some columns of each shown
    table; key columns stay) applied to a report: a new report, same data."""
    from dataclasses import replace

    tables = dict(report.tables)
    if getattr(args, "table", None):
        if args.table not in tables:
            raise UsageError(f"no table {args.table!r} in this report; tables: {', '.join(tables)}")
        tables = {args.table: tables[args.table]}
    if args.columns:
        from .render.layout import KEY_COLUMNS

        want = [w.strip().lower() for w in args.columns.split(",") if w.strip()]
        found = set()
        for name, t in list(tables.items()):
            if t.style == "list":
                continue
            keep = []
            for i, (key, header, spec) in enumerate(t.columns):
                hit = [w for w in want if w in (key.lower(), header.lower())
                       or (" | " in header and w == header.split(" | ", 1)[1].lower())]
                found.update(hit)
                if hit or (key in KEY_COLUMNS and all(k in KEY_COLUMNS for k, _, _ in t.columns[:i])):
                    keep.append((key, header, spec))
            tables[name] = replace(t, columns=keep)
        unknown = [w for w in want if w not in found]
        if unknown:
            first = report.tables[next(iter(tables))]
            raise UsageError(f"--columns: no column {', '.join(map(repr, unknown))}; columns of "
                             f"{first.title.split(' (')[0]!r}: {', '.join(h for _, h, _ in first.columns)}")
    return replace(report, tables=tables)


def _read_ahead(traces: Sequence[str]) -> Optional[tuple]:
    """A single trace file: its first chunks decoded (Arrow's threads)
    while the analyzers are imported (pandas: ~0.3 s on one core), as the
    report will read them (trace.parquet.read_ahead); returns what
    ``parquet.drop_ahead`` takes. Anything odd is left to the report to
    say."""
    if len(traces) != 1:
        return None
    from .trace import parquet, schema      # not the reading side's other modules: the decoding starts first

    where = parquet.trace_file(traces[0])      # paths only: nothing raised, None for anything else
    if where is None:
        return None
    return parquet.read_ahead(where, schema.TRACE_SCHEMA.names, parquet.CHUNK_ROWS, skip_empty=True)


def cmd_report(args) -> int:
    import gc

    _keep_heap()
    _load_quietly()
    _arrow_pool()
    # Python's cycle collector holds the GIL while it walks every object, and finds next to nothing
    # here: a 10 M-event report ran ~200 collections for ~0.06 s and freed ~1,200 objects
    # (benchmarks/results/report_speed/). It is off while the report runs, then as it was.
    was_on = gc.isenabled()
    gc.disable()
    ahead = None
    threads = _arrow_threads()
    try:
        ahead = _read_ahead(args.traces)
        return _report(args)
    finally:        # a report that ended before reading (a bad argument or file) leaves nothing read ahead
        if ahead is not None:
            from .trace import parquet

            parquet.drop_ahead(ahead)
        if was_on:
            gc.enable()
        import pyarrow as pa

        pa.set_cpu_count(threads)


def _report(args) -> int:
    from . import render
    from .api import compare
    from .trace.files import atomic_write
    from .trace.schema import TraceFormatError

    group_by = [k.strip() for k in args.group_by.split(",") if k.strip()] if args.group_by else None
    if args.warmup < 0:
        raise TraceFormatError("--warmup must be >= 0")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        raise UsageError("--peak-tflops must be > 0")
    import time

    cmp_ = compare(args.traces, warmup=args.warmup, batch_size=args.batch_size, group_by=group_by,
                   peak_tflops=args.peak_tflops)
    report = cmp_.report()
    t_render = time.perf_counter()
    fmt = args.format or (render.format_for_path(args.output) if args.output else None) or "table"
    shown = _select(report, args)
    if fmt == "csv":
        text = render.RENDERERS[fmt](table=args.table).render(shown)
    else:
        text = _renderer(args, fmt, to_file=bool(args.output)).render(shown)
    if args.output:
        atomic_write(args.output, text)
    else:
        sys.stdout.write(text)
    if args.out_dir:
        written = render.write_all(report, args.out_dir)
        sys.stderr.write(f"commprof: wrote {', '.join(written)}\n")
    if args.timings:
        stages = list(cmp_.timings or []) + [("render and write", time.perf_counter() - t_render)]
        width = max(len(k) for k, _ in stages)
        from .analyzers import native

        sys.stderr.write("commprof: time per stage\n" + "".join(f"  {k:<{width}}  {v:8.2f} s\n" for k, v in stages)
                         + f"  analysis kernels: {native.status()}\n")
    return 0
