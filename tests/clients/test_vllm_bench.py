"""vLLM's own benchmark client, ``vllm bench serve`` (the lane's install), against the emulator serving the tiny
model's tokenizer: no tokenizer mismatch, every request successful, and the prompt tokens it reports are the
tokens the server counted (``vllm:prompt_tokens_total`` delta). The same runs against the real lane server
(marked ``vllm``) hold the same properties: the emulator answers this client as vLLM does.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from external import counter, lane_like, run, settled_counter, tiny_tokenizer, vllm_bin
from vllm_lane import exclusive, running_server_url

from blis_sim.emulator import start_emulator

PROMPTS = 24
DATASETS = {
    "random": ["--random-input-len", "256", "--random-output-len", "8"],
    "prefix_repetition": ["--prefix-repetition-prefix-len", "192", "--prefix-repetition-suffix-len", "64",
                          "--prefix-repetition-num-prefixes", "3", "--prefix-repetition-output-len", "8"],
}


def bench(url: str, dataset: str, tmp_path: Path) -> tuple[dict[str, Any], str, float]:
    """(vllm bench serve's result JSON, its output, the server's prompt-token counter delta)."""
    vllm, tokenizer = vllm_bin(), tiny_tokenizer()
    before = counter(url, "vllm:prompt_tokens_total")
    proc = run([vllm, "bench", "serve", "--base-url", url, "--model", "tiny-llama", "--tokenizer", tokenizer,
                "--dataset-name", dataset, *DATASETS[dataset], "--num-prompts", str(PROMPTS), "--seed", "3",
                "--request-rate", "inf", "--max-concurrency", "8", "--ignore-eos", "--save-result",
                "--result-dir", tmp_path, "--result-filename", "result.json"], cwd=tmp_path)
    delta = settled_counter(url, "vllm:prompt_tokens_total") - before
    return json.loads((tmp_path / "result.json").read_text()), proc.stdout + proc.stderr, delta


def check(result: dict[str, Any], output: str, delta: float) -> None:
    assert "tokenizer mismatch" not in output, output[-2000:]
    assert (result["completed"], result["failed"]) == (PROMPTS, 0), output[-2000:]
    assert result["total_input_tokens"] == delta
    assert result["total_output_tokens"] == 8 * PROMPTS


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_vllm_bench_serve_counts_as_the_emulator(dataset: str, tmp_path: Path) -> None:
    with start_emulator(lane_like(tiny_tokenizer())) as emu:
        check(*bench(emu.url, dataset, tmp_path))


@pytest.mark.vllm
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_vllm_bench_serve_counts_as_the_real_server(dataset: str, tmp_path: Path) -> None:
    url = running_server_url()
    with exclusive():
        check(*bench(url, dataset, tmp_path))
