"""`blis sweep` and `blis plan`: argument parsing around :mod:`blis_sim.sweep`.

Both take the base of `blis replay` (``--trace-header/--trace-data``) or of `blis run`
(``--workload-spec``, ``--num-requests``, ``--workload-seed``) with the simulator flags of those
commands, an output directory, and where to run (``--workers``, ``--ray-address``). Errors are one
line, exit code 2 (blis_sim.cli handles BlisError).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from blis_sim.errors import UsageError

if TYPE_CHECKING:
    from blis_sim.cli import Subparsers
    from blis_sim.sweep.base import SweepBase
    from blis_sim.sweep.runner import Backend

# What a command runs is imported inside its function: `blis --help` imports every subcommand's
# module (blis_sim/cli.py), and a command needs only its own dependencies.


def _base_flags(p: argparse.ArgumentParser) -> None:
    from blis_sim.engine.cli import add_sim_flags

    g = p.add_argument_group("base (a trace, or a workload spec)")
    g.add_argument("--trace-header", default=None, help="TraceV2 header YAML")
    g.add_argument("--trace-data", default=None, help="TraceV2 data CSV")
    g.add_argument("--workload-spec", default=None, help="workload spec YAML (instead of a trace)")
    g.add_argument("--num-requests", type=int, default=None, help="override the spec's num_requests")
    g.add_argument("--workload-seed", type=int, default=None, help="override the spec's seed")
    add_sim_flags(p)
    r = p.add_argument_group("where it runs")
    r.add_argument("--output-dir", required=True, help="table, plots and finished points (resume)")
    r.add_argument("--workers", type=int, default=None,
                   help="parallel simulations (default: every local core, or every CPU of the Ray "
                        "cluster); 1 runs in this process")
    r.add_argument("--ray-address", default=None,
                   help="run on a Ray cluster: 'auto' (this node's cluster), 'ray://HOST:10001', "
                        "'HOST:6379', or 'local' (a Ray instance started here); needs the [ray] extra")
    r.add_argument("--force", action="store_true",
                   help="recompute every point (default: points finished in an earlier run are kept)")


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="what-if sweep of simulator settings (a grid or a zip of axes)",
        description="Replay a trace (or run a workload spec) at every point of a sweep file; one "
                    "table row per point (CSV, Parquet with pyarrow) and a plot per axis.")
    p.add_argument("--sweep", required=True, help="sweep file YAML (axes, mode, plot)")
    p.add_argument("--no-plots", action="store_true", help="write the table only")
    _base_flags(p)
    p.set_defaults(func=cmd_sweep)

    p = subparsers.add_parser(
        "plan", help="capacity search: the smallest or largest setting that meets a target",
        description="Search one monotone axis for the smallest (or largest) value that meets a "
                    "target, e.g. the smallest CPU tier with an external hit-rate of 90 %%, or the "
                    "highest rate whose TTFT p99 stays under 500 ms; prints the answer and the curve "
                    "that supports it.")
    p.add_argument("--axis", required=True,
                   help="the axis searched: kv_offload.cpu_bytes_to_use, "
                        "kv_offload.secondary_tiers.0.max_bytes, total_kv_blocks, "
                        "workload.aggregate_rate (spec), rate_scale (trace), ...")
    p.add_argument("--range", nargs=2, required=True, metavar=("LOW", "HIGH"),
                   help="search interval (byte sizes may carry units: 256MiB 16GiB)")
    p.add_argument("--target", required=True,
                   help="condition on a table column: 'hit_rate.external>=0.9', 'ttft_p99_ms<=500'")
    p.add_argument("--find", choices=("smallest", "largest"), default="smallest",
                   help="smallest value meeting the target (capacity), or largest (rate)")
    p.add_argument("--resolution", default=None,
                   help="stop when the bracket is this narrow (axis units; default: 1/100 of the range)")
    p.add_argument("--max-rounds", type=int, default=30)
    p.add_argument("--set", action="append", default=[], metavar="AXIS=VALUE",
                   help="hold another axis at a value (YAML scalar), e.g. total_kv_blocks=500")
    _base_flags(p)
    p.set_defaults(func=cmd_plan)


# --------------------------------------------------------------------------------------------


def _digest(*paths: str) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def base_from_args(args: argparse.Namespace) -> SweepBase:
    """The sweep's base from the flags of `blis replay` / `blis run`."""
    from blis_sim.engine.cli import options_from_args, require_files
    from blis_sim.sweep.base import Payload, SweepBase

    trace_given = bool(args.trace_header or args.trace_data)
    if trace_given == bool(args.workload_spec):
        raise UsageError("give a base: --trace-header and --trace-data, or --workload-spec")
    classes = None
    if args.defaults_filepath:
        from blis_sim.formats.offload import load_device_classes

        classes = load_device_classes(args.defaults_filepath)
    if args.workload_spec:
        from blis_sim.formats._strict import load_yaml
        from blis_sim.formats.workload import workload_spec_from_doc

        require_files(args, "workload_spec")
        doc = load_yaml(args.workload_spec)
        spec = workload_spec_from_doc(doc)
        options = options_from_args(args)
        return SweepBase(Payload("spec", workload_seed=args.workload_seed, num_requests=args.num_requests),
                         options, fingerprint="spec", spec_data=doc.data, spec=spec,
                         device_classes=classes, label=str(args.workload_spec))
    from blis_sim.formats import load_trace

    require_files(args, "trace_header", "trace_data")
    if args.num_requests is not None or args.workload_seed is not None:
        raise UsageError("--num-requests and --workload-seed apply to a --workload-spec base")
    trace = load_trace(args.trace_header, args.trace_data)
    if not args.model:
        raise UsageError("LLM name not provided (--model)")
    options = options_from_args(args, trace.header)  # the offload tiers resolved against the header (INV-13)
    return SweepBase(Payload("trace", trace=trace), options,
                     fingerprint=_digest(args.trace_header, args.trace_data), device_classes=classes,
                     label=str(args.trace_data))


def backend_from_args(args: argparse.Namespace) -> Backend:
    from blis_sim.sweep.runner import Backend

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be ≥ 1, got {args.workers}")
    return Backend(workers=args.workers, ray_address=args.ray_address)


def cmd_sweep(args: argparse.Namespace) -> int:
    from blis_sim.sweep.run import run_sweep
    from blis_sim.sweep.spec import load_sweep_file

    base = base_from_args(args)
    sweep = load_sweep_file(args.sweep, base_kind=base.kind)
    result = run_sweep(base, sweep, args.output_dir, backend=backend_from_args(args), force=args.force,
                       plots=not args.no_plots, progress=sys.stderr)
    for path in result.files:
        print(f"sweep: wrote {path}", file=sys.stderr)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from blis_sim.sweep.plan import PlanQuestion, run_plan

    base = base_from_args(args)
    question = PlanQuestion.from_flags(axis=args.axis, low=args.range[0], high=args.range[1],
                                       target=args.target, find=args.find, resolution=args.resolution,
                                       fixed=args.set, base_kind=base.kind)
    if args.max_rounds < 1:
        raise UsageError(f"--max-rounds must be ≥ 1, got {args.max_rounds}")
    answer = run_plan(base, question, args.output_dir, backend=backend_from_args(args), force=args.force,
                      max_rounds=args.max_rounds, progress=sys.stderr)
    sys.stdout.write(answer.text() + "\n")
    return 0 if answer.value is not None else 1
