"""Would libyaml keep the strict YAML loader's answers? A differential run over the soak's seeded inputs.

``blis_sim.formats._yamlin.parse`` (what ``_strict.parse_yaml`` uses for every document) composes with PyYAML's pure-Python parser, which is most of a YAML
input's cost in the fuzz soak. This parses the first ``--inputs`` mutated inputs of each YAML format twice,
as is and with the composer swapped for libyaml's (``yaml.CSafeLoader`` base, same implicit resolvers), and
counts the inputs whose outcome differs: the error line, or the data, line map or raw plain-scalar text of a
document that loads. The loader may switch only if that count is 0.

    python benchmarks/yaml_loader_diff.py --inputs 1500 --formats trace-header,coefficients-yaml
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fuzzing  # noqa: E402  (tests/fuzzing.py: the harness the tests use)
from blis_sim.errors import FormatError  # noqa: E402
from blis_sim.formats import _yamlin  # noqa: E402


class _CLoader(yaml.CSafeLoader):
    yaml_implicit_resolvers = _yamlin._Loader.yaml_implicit_resolvers  # the YAML 1.2 exponent floats too


def _outcome(text: str) -> tuple[Any, ...]:
    try:
        data, lines, raw = _yamlin.parse(text, "f.yaml")  # PyYAML itself (parse_yaml may not use it)
    except FormatError as exc:
        return ("error", str(exc))
    return ("loaded", repr(data), sorted(lines.items(), key=repr), sorted(raw.items(), key=repr))


def _with_libyaml(text: str) -> tuple[Any, ...]:
    compose = yaml.compose
    with mock.patch.object(_yamlin.yaml, "compose", lambda s, Loader=None: compose(s, Loader=_CLoader)):
        return _outcome(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=1500)
    ap.add_argument("--formats", default=",".join(n for n, t in fuzzing.TARGETS.items() if t.kind == "yaml"))
    ap.add_argument("--seed", default="soak")
    ap.add_argument("--show", type=int, default=5, help="differences printed")
    args = ap.parse_args(argv)
    if not yaml.__with_libyaml__:
        ap.error("PyYAML was built without libyaml")
    compared = differ = 0
    t_py = t_c = 0.0
    for name in args.formats.split(","):
        target = fuzzing.TARGETS[name]
        base = target.sample()
        for i in range(args.inputs):
            try:
                text = fuzzing.mutate(target, base, random.Random(f"{args.seed}:{name}:{i}")).decode()
            except UnicodeDecodeError:
                continue  # refused before YAML parsing, either way
            t0 = time.perf_counter()
            a = _outcome(text)
            t1 = time.perf_counter()
            b = _with_libyaml(text)
            t_py, t_c = t_py + t1 - t0, t_c + time.perf_counter() - t1
            compared += 1
            if a != b:
                differ += 1
                if differ <= args.show:
                    where = "error line" if a[0] == b[0] == "error" else ("outcome" if a[0] != b[0] else
                            ["data", "line map", "raw plain scalars"][next(k for k in (1, 2, 3) if a[k] != b[k]) - 1])
                    print(f"{name} input #{i}: {where} differs\n  python : {str(a[1])[:150]}\n  libyaml: "
                          f"{str(b[1])[:150]}")
    print(f"{compared} inputs compared, {differ} differ; parse time python {t_py:.2f} s, libyaml {t_c:.2f} s "
          f"({t_py / max(t_c, 1e-9):.1f}x)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
