"""Design D3: the emulator shares no code with the simulator (KV core, engine, workload, observe)."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import blis_sim.emulator

FORBIDDEN = ("blis_sim.kv", "blis_sim.engine", "blis_sim.workload", "blis_sim.observe",
             "blis_sim.calibrate", "pytest_blis")
PACKAGE = Path(blis_sim.emulator.__file__).parent
SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_source_file_imports_the_simulator() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) >= 10
    offenders = {
        f"{path.name}: {name}"
        for path in files
        for name in _imported_modules(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not offenders


def test_the_ast_scan_would_catch_an_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from blis_sim.kv import BlockPool\nimport blis_sim.engine.loop\n")
    assert {"blis_sim.kv", "blis_sim.engine.loop"} <= _imported_modules(bad)


def test_running_emulator_with_offload_loads_no_simulator_module() -> None:
    # A fresh interpreter: start an emulator with the tiered offload config, serve one request,
    # then list what got imported.
    code = textwrap.dedent(f"""
        import sys, httpx
        from blis_sim.emulator import EmulatorConfig, start_emulator
        cfg = EmulatorConfig(profile="zero", kv_bytes_per_token=163840,
                             kv_offload_config={str(SAMPLES / 'blis' / 'offload.yaml')!r})
        with start_emulator(cfg) as emu:
            httpx.post(emu.url + "/v1/completions", json={{"prompt": "hello world", "max_tokens": 2}},
                       timeout=10).raise_for_status()
            httpx.get(emu.url + "/metrics", timeout=10).raise_for_status()
        print("\\n".join(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert "blis_sim.emulator.offload" in loaded and "blis_sim.formats.offload" in loaded
    assert not [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
