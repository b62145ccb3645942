"""The fuzz harness shared by the tests (tests/test_fuzz_inputs.py) and the soak (benchmarks/fuzz_soak.py).

Every input the project reads is a :class:`Target`: a sample file, and what the CLI does with that file up to
the point where it would start simulating (parse, validate, resolve, build the compiled KV core). Inputs are
mutated two ways:

- byte-level (:func:`mutate_bytes`): one mutation of the sample's bytes (bit flip, control character,
  duplicated or swapped line, a number made huge or negative, a cut, a splice, invalid UTF-8, ...);
- structure-aware (:func:`mutate_structure`): the sample parsed, one field (or CSV cell) replaced by a
  wrong value or removed, or an unknown key added, and written back.

The property (:func:`check`): the target either loads, or raises a :class:`~blis_sim.errors.BlisError` whose
CLI line (``blis_sim.errors.error_line``, what ``blis`` prints) is one line naming the file (several problems of
one file, :class:`~blis_sim.errors.ConfigErrors`: a summary line and one such line per problem); a parse error
names the line too. Anything else (a traceback) or a target running longer than ``timeout_s`` (a hang) is a
:class:`Failure`. No hypothesis here: the soak drives these with ``random.Random``, the tests with
hypothesis' ``st.randoms()``.
"""
from __future__ import annotations

import csv
import io
import json
import random
import re
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from blis_sim.errors import BlisError, ConfigErrors, error_line

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"
VLLM = REPO / "samples" / "vllm-cpu"
KV_BYTES_PER_TOKEN = 163840  # Qwen3-14B, as the samples

# --------------------------------------------------------------------------------------------- samples

# Large samples are cut to a few rows: the fuzz exercises the same code on every row, and a short file
# makes each mutation count (and each input fast).
ROWS = 12

PHASED_SPEC = """\
version: "2"
seed: 7
category: language
aggregate_rate: 4
phases:
  - name: seed
    num_requests: 4
    clients:
      - {id: g0, rate_fraction: 1.0, prefix_group: sys-0, prefix_length: 64, arrival: {process: poisson},
         input_distribution: {type: gaussian, params: {mean: 32, std_dev: 8, min: 8, max: 64}},
         output_distribution: {type: exponential, params: {mean: 8}}}
  - {name: repeat, repeat: seed, num_requests: 6, aggregate_rate: 8, gap_us: 1000}
"""


def _head_lines(path: Path, n: int) -> bytes:
    return b"".join(path.read_bytes().splitlines(keepends=True)[:n + 1])


def _json_head(path: Path, n: int) -> bytes:
    data = json.loads(path.read_text())
    if isinstance(data, list):
        data = data[:n]
    elif isinstance(data.get("requests"), list):
        data["requests"] = data["requests"][:n]
    return json.dumps(data, indent=2).encode()


def _workload_sample() -> bytes:
    """The BLIS sample spec with 3 of its 17 clients (the same shapes: prefix groups and unique traffic)."""
    lines = (BLIS / "workload.yaml").read_bytes().splitlines(keepends=True)
    clients = [i for i, line in enumerate(lines) if line.lstrip().startswith(b"- {id:")]
    keep = set(clients[:2] + clients[-1:])
    return b"".join(line for i, line in enumerate(lines) if i not in clients or i in keep)


def _itl_sample() -> bytes:
    rows = ["request_id,chunk_index,timestamp_us"]
    for rid in range(4):
        rows += [f"{rid},{i},{1795972159000000 + rid * 1000 + i * 37}" for i in range(3)]
    return ("\n".join(rows) + "\n").encode()


def _coefficients(suffix: str) -> bytes:
    from blis_sim.engine.latency import DEFAULT_COEFFICIENTS

    data = DEFAULT_COEFFICIENTS.model_dump(exclude_none=True)
    return (json.dumps(data, indent=2) if suffix == ".json" else yaml.safe_dump(data, sort_keys=False)).encode()


# --------------------------------------------------------------------------------------------- loaders


def _load_trace_header(path: Path) -> None:
    from blis_sim.formats.offload import OffloadConfig
    from blis_sim.formats.trace_header import read_trace_header

    header = read_trace_header(path)
    if header.kv_offload is not None:
        ext = header.pytest_blis.offload if header.pytest_blis is not None else None
        _build_kv(OffloadConfig.from_header(header.kv_offload, ext, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                                            file=str(path)), header)


def _build_kv(cfg: Any, header: Any = None) -> None:
    """What replay does with a resolved offload config: the KV config and the compiled core."""
    from blis_sim.engine.simulate import build_kv

    blocks = 64
    if header is not None and header.pytest_blis is not None and header.pytest_blis.kv_geometry is not None:
        blocks = header.pytest_blis.kv_geometry.num_gpu_blocks or blocks
    build_kv(blocks, cfg.gpu_block_size, cfg, seed=0)


def _load_trace_data(path: Path) -> None:
    from blis_sim.formats import read_trace_data

    read_trace_data(path)


# samples/blis/offload.yaml as a deployment passes it to `vllm serve --kv-transfer-config`
VLLM_OFFLOAD = json.dumps({
    "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1073741824,
                                  "eviction_policy": "lru", "offload_prompt_only": True,
                                  "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv-cache", "n_read_threads": 16,
                                                       "n_write_threads": 16, "locality": "LOCAL"}]}}, indent=2)


def _load_offload(path: Path) -> None:
    from blis_sim.formats.offload import load_offload_config

    _build_kv(load_offload_config(path, kv_bytes_per_token=KV_BYTES_PER_TOKEN, warn=lambda message: None))


def _load_workload(path: Path) -> None:
    from blis_sim.formats.workload import load_workload_spec

    load_workload_spec(path)


def _load_sim_results(path: Path) -> None:
    from blis_sim.formats.results import load_sim_results

    load_sim_results(path)


def _load_metrics(path: Path) -> None:
    from blis_sim.formats.results import load_metrics_output

    load_metrics_output(path)


def _load_report(path: Path) -> None:
    from blis_sim.formats.report import load_report

    load_report(path)


def _load_itl(path: Path) -> None:
    from blis_sim.formats.itl import itl_by_request, read_itl

    itl_by_request(read_itl(path))


def _load_coefficients(path: Path) -> None:
    from blis_sim.engine.latency import load_coefficients

    load_coefficients(path).to_step_model()


def _load_scenario(path: Path) -> None:
    from pytest_blis._scenario import load_scenario_file

    load_scenario_file(path)


@lru_cache(maxsize=4)
def _before_snapshot(url: str) -> Any:
    from blis_sim.observe.metrics import parse_exposition

    return parse_exposition((VLLM / "metrics-before.txt").read_text(), url=url)


def _load_exposition(path: Path) -> None:
    """What observe does with two scrapes: parse each, then the counter window between them."""
    from blis_sim.observe.metrics import derive_window, kv_geometry, parse_exposition

    before = _before_snapshot(str(path))
    after = parse_exposition(path.read_bytes().decode("utf-8", errors="replace"), url=str(path))
    derive_window(before, after, model="tiny-llama")
    kv_geometry(after)


# --------------------------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """One input format: its sample, how it is written (for structure-aware mutation) and its loader."""

    name: str
    command: str  # the `blis` subcommand whose error line is checked
    filename: str
    kind: str  # yaml | json | csv | text
    sample: Callable[[], bytes]
    load: Callable[[Path], None]


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("trace-header", "replay", "trace.yaml", "yaml", lambda: (BLIS / "trace-observed.yaml").read_bytes(),
           _load_trace_header),
    Target("trace-header-vllm", "replay", "trace.yaml", "yaml", lambda: (VLLM / "trace.yaml").read_bytes(),
           _load_trace_header),
    Target("trace-data", "replay", "trace.csv", "csv", lambda: _head_lines(VLLM / "trace.csv", ROWS),
           _load_trace_data),
    Target("workload-spec", "run", "workload.yaml", "yaml", _workload_sample, _load_workload),
    Target("workload-phases", "run", "spec.yaml", "yaml", lambda: PHASED_SPEC.encode(), _load_workload),
    Target("offload-config", "replay", "offload.yaml", "yaml", lambda: (BLIS / "offload.yaml").read_bytes(),
           _load_offload),
    Target("offload-config-vllm", "replay", "kv-transfer-config.json", "json", lambda: VLLM_OFFLOAD.encode(),
           _load_offload),
    Target("sim-results", "calibrate", "sim.json", "json", lambda: _json_head(BLIS / "sim.json", ROWS),
           _load_sim_results),
    Target("metrics-output", "calibrate", "simagg.json", "json", lambda: _json_head(BLIS / "simagg.json", ROWS),
           _load_metrics),
    Target("calibration-report", "calibrate", "calibration.json", "json",
           lambda: (BLIS / "calibration.json").read_bytes(), _load_report),
    Target("itl-csv", "calibrate", "trace.itl.csv", "csv", _itl_sample, _load_itl),
    Target("coefficients-yaml", "replay", "coeffs.yaml", "yaml", lambda: _coefficients(".yaml"),
           _load_coefficients),
    Target("coefficients-json", "replay", "coeffs.json", "json", lambda: _coefficients(".json"),
           _load_coefficients),
    Target("scenario", "pytest", "minimal.blis.yaml", "yaml",
           lambda: (REPO / "scenarios" / "minimal.blis.yaml").read_bytes(), _load_scenario),
    Target("exposition", "observe", "metrics.txt", "text", lambda: (VLLM / "metrics-after.txt").read_bytes(),
           _load_exposition),
)}

# --------------------------------------------------------------------------------------------- mutation

CONTROL = [bytes([c]) for c in (*range(0, 9), 11, 12, *range(14, 32), 127)]
HUGE = [b"9" * n for n in (19, 20, 25, 40, 400)] + [b"-9223372036854775809", b"18446744073709551616",
                                                      b"1e400", b"-1", b"0", b"NaN", b"-Infinity", b".inf"]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    """One random byte-level mutation of ``data``."""
    lines = data.splitlines(keepends=True)
    n = len(data)
    pos = rnd.randrange(n + 1)
    op = rnd.randrange(13)
    if op == 0 and n:  # flip one bit
        i = rnd.randrange(n)
        return data[:i] + bytes([data[i] ^ (1 << rnd.randrange(8))]) + data[i + 1:]
    if op == 1:  # a control character
        return data[:pos] + rnd.choice(CONTROL) + data[pos:]
    if op == 2 and lines:  # duplicate a line (a duplicate key, a duplicate row)
        i = rnd.randrange(len(lines))
        return b"".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
    if op == 3 and len(lines) > 1:  # swap two lines
        i, j = rnd.randrange(len(lines)), rnd.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return b"".join(lines)
    if op == 4:  # a number made huge, negative, zero or not a number
        numbers = list(_NUMBER.finditer(data))
        if numbers:
            m = rnd.choice(numbers)
            return data[:m.start()] + rnd.choice(HUGE) + data[m.end():]
    if op == 5:  # truncate
        return data[:pos]
    if op == 6 and n:  # delete a run
        return data[:pos] + data[pos + rnd.randrange(1, 64):]
    if op == 7 and n:  # splice: copy a run of the file elsewhere
        i = rnd.randrange(n)
        return data[:pos] + data[i:i + rnd.randrange(1, 128)] + data[pos:]
    if op == 8:  # invalid UTF-8
        return data[:pos] + rnd.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]) + data[pos:]
    if op == 9:  # a structural character
        return data[:pos] + rnd.choice([b"{", b"}", b"[", b"]", b":", b",", b'"', b"'", b"\n", b"\r", b"- ",
                                        b"&a ", b"*a", b"!!python/object ", b"\t", b"#", b"\\"]) + data[pos:]
    if op == 10 and lines:  # a line repeated many times, or one very long line
        i = rnd.randrange(len(lines))
        if rnd.random() < 0.5:
            return b"".join(lines[:i] + [lines[i]] * rnd.randrange(2, 200) + lines[i:])
        return data[:pos] + b"x" * rnd.choice([1000, 100_000]) + data[pos:]
    if op == 11:  # an empty file, or whitespace only, or a BOM
        return rnd.choice([b"", b"\n", b"   ", b"\xef\xbb\xbf" + data, b"null", b"[]", b"{}", b"---\n---\n"])
    # op 12 (or a mutation that did not apply): overwrite one byte with a random one
    if n:
        i = rnd.randrange(n)
        return data[:i] + bytes([rnd.randrange(256)]) + data[i + 1:]
    return bytes([rnd.randrange(256)])


WRONG_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, 10**18, 10**30, -(10**18), 1.5, -0.5, 1e308, float("inf"),
    float("nan"), "", "x", "1", "-1", "\x01", "a\nb", "é" * 3, "9" * 40, [], [1, 2], {}, {"bogus": 1},
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _set(data: Any, path: tuple[Any, ...], rnd: random.Random) -> Any:
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = rnd.randrange(10)
    if action == 0 and isinstance(parent, dict):
        del parent[key]
    elif action == 1 and isinstance(parent, dict):
        parent["bogus_" + str(rnd.randrange(10))] = rnd.choice(WRONG_VALUES)
    else:
        parent[key] = rnd.choice(WRONG_VALUES)
    return data


def mutate_structure(target: Target, data: bytes, rnd: random.Random) -> bytes:
    """The sample parsed, one field wrong (or removed, or an unknown key beside it), written back."""
    text = data.decode()
    if target.kind == "csv":
        rows = list(csv.reader(io.StringIO(text)))
        r = rnd.randrange(len(rows))
        c = rnd.randrange(len(rows[r]))
        value = rnd.choice(WRONG_VALUES)
        rows[r][c] = "" if value is None else str(value)
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        return out.getvalue().encode()
    if target.kind == "text":  # exposition: one sample value or label wrong
        lines = text.splitlines(keepends=True)
        samples = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
        i = rnd.choice(samples)
        name, _, value = lines[i].rstrip("\n").rpartition(" ")
        wrong = str(rnd.choice(WRONG_VALUES))
        lines[i] = (f"{name} {wrong}\n" if rnd.random() < 0.7 else f"{name.replace('=', '=x', 1)} {value}\n")
        return "".join(lines).encode()
    doc = yaml.safe_load(text) if target.kind == "yaml" else json.loads(text)
    paths = list(_paths(doc))
    if not paths:
        return data
    doc = _set(doc, rnd.choice(paths), rnd)
    if target.kind == "yaml":
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()
    return json.dumps(doc, indent=2).encode()


def mutate(target: Target, data: bytes, rnd: random.Random) -> bytes:
    """Either kind of mutation, half the time each."""
    if rnd.random() < 0.5:
        return mutate_bytes(data, rnd)
    return mutate_structure(target, data, rnd)


# --------------------------------------------------------------------------------------------- property


@dataclass(frozen=True)
class Failure:
    target: str
    kind: str  # traceback | hang | bad-message
    detail: str
    data: bytes

    def __str__(self) -> str:
        return f"{self.target}: {self.kind}: {self.detail}\ninput: {self.data[:400]!r}"


class _Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_Hang` in the main thread after ``seconds`` (SIGALRM)."""
    def on_alarm(signum: int, frame: Any) -> None:
        raise _Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_PARSE_ERROR = re.compile(r"invalid (YAML|JSON)|duplicate key|CSV")


def message_problem(line: str, path: Path, command: str) -> str | None:
    """Why ``line`` (what the CLI printed) is not a good error line, or None."""
    if "\n" in line or "\r" in line:
        return "more than one line"
    if not line.startswith(f"blis {command}: error: "):
        return "not the CLI's error prefix"
    if str(path) not in line:
        return "does not name the file"
    if "Traceback" in line or "<unicode string>" in line:
        return "a traceback or a parser's raw text"
    if _PARSE_ERROR.search(line) and not re.search(re.escape(str(path)) + r":\d+", line):
        return "a parse error without its line"
    return None


def run(target: Target, data: bytes, workdir: Path, *, timeout_s: float = 10.0) -> tuple[str, Failure | None]:
    """Write ``data`` as the target's file in ``workdir`` and load it: ``("loaded" | "input-error", None)``, or
    the kind of failure (``traceback`` | ``hang`` | ``bad-message``) and the :class:`Failure`."""
    path = workdir / target.filename
    path.write_bytes(data)
    try:
        with time_limit(timeout_s):
            target.load(path)
    except BlisError as exc:
        # several problems of one file (ConfigErrors): a summary line, then one line per problem; each must be
        # a good error line by itself
        lines = [exc.args[0], *map(str, exc.problems)] if isinstance(exc, ConfigErrors) else [str(exc)]
        for line in (error_line(target.command, BlisError(text)) for text in lines):
            problem = message_problem(line, path, target.command)
            if problem:
                return "bad-message", Failure(target.name, "bad-message", f"{problem}: {line!r}", data)
        return "input-error", None
    except _Hang:
        return "hang", Failure(target.name, "hang", f"no answer within {timeout_s} s", data)
    except Exception:  # noqa: BLE001 - the property: nothing else escapes
        return "traceback", Failure(target.name, "traceback", traceback.format_exc(limit=-4), data)
    return "loaded", None


def check(target: Target, data: bytes, workdir: Path, *, timeout_s: float = 10.0) -> Failure | None:
    """:func:`run`'s failure, or None when the property holds."""
    return run(target, data, workdir, timeout_s=timeout_s)[1]
