"""Model geometry the simulator needs without a download: KV bytes per token and GPU capacity.

``geometry_for(model, config_path=None)``: from a local ``config.json`` when given, else from the
small bundled table (the reference's two bundled models and the tiny Llama that real vLLM serves on
this project's CPU machines); ``None`` if unknown. ``default_num_gpu_blocks(model, block_size)``:
the reference's capacity formula (docs/reference-formats.md §7.3: 0.9 of an H100's memory minus weights,
activations and non-torch memory, over the bytes of one block), or the reference's literal default
of 1,000,000 blocks for an unknown model.
"""
from __future__ import annotations

from pathlib import Path

from blis_sim.defaults import DEFAULT_TOTAL_KV_BLOCKS
from blis_sim.engine.latency import ModelGeometry, get_hardware, load_model_config

KNOWN_MODELS: dict[str, ModelGeometry] = {
    "qwen/qwen3-14b": ModelGeometry(layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128,
                                    intermediate=17408, vocab=151936, bytes_per_param=2.0,
                                    weight_bytes_per_param=2.0),
    "meta-llama/llama-3.1-8b-instruct": ModelGeometry(
        layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
        vocab=128256, bytes_per_param=2.0, weight_bytes_per_param=2.0),
    "tiny-llama": ModelGeometry(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32,
                                intermediate=256, vocab=8000, bytes_per_param=2.0,
                                weight_bytes_per_param=2.0),
}


def geometry_for(model: str, config_path: str | Path | None = None) -> ModelGeometry | None:
    if config_path is not None:
        return load_model_config(config_path)
    return KNOWN_MODELS.get(model.lower())


def default_num_gpu_blocks(model: str, block_size: int, *, hardware: str = "H100", tp: int = 1,
                           gpu_memory_utilization: float = 0.9,
                           geometry: ModelGeometry | None = None) -> int:
    g = geometry or geometry_for(model)
    if g is None:
        return DEFAULT_TOTAL_KV_BLOCKS
    hw = get_hardware(hardware)
    gib = float(1 << 30)
    kv_dim = g.kv_heads * g.head_dim
    params = (g.vocab * g.hidden + g.layers * (g.hidden * (g.hidden + 2 * kv_dim) + g.hidden ** 2
                                              + 2 * g.hidden)
              + g.layers * 3 * g.hidden * g.intermediate + g.vocab * g.hidden + g.hidden)
    weights = params * g.weight_bytes_per_param / gib
    non_torch = (0.15 if tp == 1 else 0.6) * tp
    allocatable = hw.memory_gib * gpu_memory_utilization * tp - (weights + 5.5 + non_torch)
    per_block = int(g.kv_bytes_per_token(tp) * block_size)
    if allocatable <= 0 or per_block <= 0:
        return DEFAULT_TOTAL_KV_BLOCKS
    return max(2, int(allocatable * gib) // per_block)
