"""The installed package: console script, plugin entry point, backend switches."""
from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import blis_sim
from blis_sim import _backend

ROOT = Path(__file__).resolve().parents[1]


def test_console_script_reports_version() -> None:
    out = subprocess.run([sys.executable, "-m", "blis_sim", "--version"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == f"blis {blis_sim.__version__}"


def test_pytest11_entry_point_registered() -> None:
    eps = importlib.metadata.entry_points(group="pytest11")
    assert any(ep.name == "blis" and ep.value == "pytest_blis.plugin" for ep in eps)


def test_unknown_subcommand_is_a_usage_error() -> None:
    out = subprocess.run([sys.executable, "-m", "blis_sim", "frobnicate"], capture_output=True,
                         text=True)
    assert out.returncode == 2
    assert "invalid choice" in out.stderr
    assert "Traceback" not in out.stderr


def test_pure_python_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLIS_PURE_PYTHON", "1")
    module, compiled = _backend.load("blis_sim._no_such_ext", "blis_sim.errors")
    assert module.__name__ == "blis_sim.errors" and compiled is False


def test_require_ext_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLIS_PURE_PYTHON", raising=False)
    monkeypatch.setenv("BLIS_REQUIRE_EXT", "1")
    with pytest.raises(ImportError, match="BLIS_REQUIRE_EXT"):
        _backend.load("blis_sim._no_such_ext", "blis_sim.errors")


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    ci_cmd = [ln for ln in ci.splitlines() if ln.startswith("pip install -e")][0].strip()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert any(ci_cmd in b for b in blocks), f"README does not show CI's test command: {ci_cmd}"


def test_readme_is_a_guide_not_a_log() -> None:
    """README guides a newcomer in at most 150 lines: the quick start, a worked example, the current figures
    each with its command, and a map of the docs. Dated run logs live in docs/benchmarks.md."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, f"README has {len(readme.splitlines())} lines (at most 150)"
    for heading in ("## Quick start", "## A worked example", "## Current figures", "## Map of the docs"):
        assert heading in readme, f"README lacks {heading!r}"
    assert "Offload tiers against a real vLLM" in readme
    assert not re.search(r"\b20\d\d-\d\d-\d\d \d\d:\d\d", readme), "README carries a dated run log"


def test_nothing_reads_outside_the_repository() -> None:
    """A clone or an sdist has no ``../shared`` beside it: every sample a test, benchmark or doc uses is in
    ``samples/``. A path that climbs out of the checkout would pass here and fail for every user."""
    pattern = re.compile(r"\.\./shared|[\"'/]shared/(samples|reference)|parents\[\d\] / \"shared\"")
    offenders = []
    for sub in ("tests", "benchmarks", "blis_sim", "pytest_blis", "tools", "docs", "scenarios", "samples",
                ".ci"):
        for path in sorted((ROOT / sub).rglob("*")):
            if path.suffix not in {".py", ".md", ".yaml", ".yml", ".txt", ""} or not path.is_file():
                continue
            if path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    for name in ("README.md", "conftest.py", "pyproject.toml", "setup.py"):
        for n, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{name}:{n}: {line.strip()}")
    assert not offenders, "reads outside the repository:\n" + "\n".join(offenders)
