"""Build the lane's random-weight Llamas and their tokenizer, from local files only.

Run by ``tools/vllm_cpu.py build-model`` with the lane virtualenv's Python (it needs that venv's torch,
transformers and tokenizers)::

    <venv>/bin/python tools/vllm_cpu_model.py OUT_DIR [--size tiny|lane] [--tokenizer-from DIR]

Recipe (docs/vllm-cpu.md): a byte-level BPE (vocabulary 8000) trained with ``tokenizers`` on
the Python standard library's ``*.py`` files (sorted, capped, so that the same Python version gives the same
corpus), wrapped as ``PreTrainedTokenizerFast`` with ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3 and a
plain chat template (``--tokenizer-from`` copies an already trained one instead: the same files); a
``LlamaConfig`` of one of two sizes with random weights from a fixed seed, saved as safetensors (bfloat16, or
float32 for a lane model on a CPU where float32 is the faster):

``tiny``  hidden 128, 2 layers, MLP 256, 4 heads (2 KV), head_dim 32: 2.3 M parameters, 5 MB. The counter
          tests' model: a step is mostly vLLM's own overhead.
``lane``  hidden 512, MLP 1536, 8 heads (4 KV), head_dim 64, and as many layers (4-14) as make a 1024-token
          prefill take ~0.2 s on one core of this machine: 4 layers (20.8 M parameters, 42 MB) on a CPU without
          AMX, 14 (52.2 M, 105 MB) on one with it, where 4 layers prefill 1024 tokens in ~55 ms and decode a
          step in ~3 ms. On a CPU too slow for 4 such layers (an AVX2-only one, where a layer's linear maps on
          1024 tokens take ~150 ms in float32 and ~800 ms in bfloat16), the narrow geometry: hidden 256, MLP
          768, 4 heads (2 KV), head_dim 64, 1-14 layers. The timing lane's model: compute dominates (a decode
          step takes several ms), so TTFT is prefill and queueing, not the HTTP frontend, and the lane's cells
          (their rates, their TTFTs) keep the regime they were designed in whatever the CPU. The dtype, the
          width and the layer count come from timing a layer's linear maps on 1024 tokens on one thread in
          bfloat16 and float32 (:func:`lane_sizing`); the JSON line records them.

The last stdout line is JSON describing what was built (sizes and SHA-256 of the files).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VOCAB_SIZE = 8000
SEED = 0
CORPUS_CAP_BYTES = 24 * 1024 * 1024  # enough text for 8000 merges; keeps training to seconds on 2 cores
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# The LlamaConfig geometry of each model size (the module docstring says what each is for).
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32},
    # lane: 4 layers here, as many as lane_sizing says when built
    "lane": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 64},
}
# The lane model's geometry on a CPU too slow for LANE_LAYERS[0] layers of the wide one within twice the target
# (lane_sizing): a quarter of its linear work per layer.
LANE_NARROW = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 1, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64}
# the lane server's KV space (tools/vllm_cpu.py server_env) over its 4096 blocks of 32 tokens: caps the layers
LANE_KV_BYTES = 2 * 1024**3
LANE_KV_TOKENS = 4096 * 32
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
# The lane model's depth (:func:`lane_sizing`): a 1024-token prefill of ~0.2 s on one core, as the lane's cells were
# designed against; at most 14 layers, whose KV for the lane's 4096 blocks of 32 tokens (1.75 GiB) fits the 2 GiB
# of KV space its server is given (tools/vllm_cpu.py server_env).
LANE_PREFILL_TARGET_MS = 200.0
LANE_LAYERS = (4, 14)  # the wide geometry's; the narrow one takes 1-14
# vLLM's prefill time per layer over this script's time for the layer's linear maps alone (attention, norms,
# the step's own overhead), measured on an AMX CPU on 2026-12-02: 4 layers prefilled 1024 tokens in 55 ms
# (server side), the linear maps of one took 4.4 ms.
VLLM_PER_LINEAR = 3.1
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus_files() -> list[Path]:
    """The standard library's sources in a fixed order, without site-packages, up to the cap."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        size = path.stat().st_size
        if total + size > CORPUS_CAP_BYTES:
            break
        chosen.append(path)
        total += size
    if not chosen:
        raise SystemExit(f"no *.py files under {stdlib}: cannot train the tokenizer")
    return chosen


def corpus_lines(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = corpus_files()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(files), trainer=trainer, length=len(files))
    for index, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == index, f"{token} is not id {index}"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=16384)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def copy_tokenizer(source: Path, out: Path) -> int:
    """The tokenizer files of an already built model folder (the same recipe, so no second training)."""
    from transformers import PreTrainedTokenizerFast

    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, out / name)
    return len(PreTrainedTokenizerFast.from_pretrained(out))


def linear_ms(geometry: dict[str, int], dtype: str = "bfloat16", tokens: int = 1024, repeats: int = 7) -> float:
    """Median time (ms) of one decoder layer's linear maps (q/k/v/o, gate/up/down) on ``tokens`` tokens, in
    ``dtype`` on one thread, as the lane server's model worker runs them."""
    import time

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    kind = getattr(torch, dtype)
    h, m = geometry["hidden_size"], geometry["intermediate_size"]
    kv = geometry["num_key_value_heads"] * geometry["head_dim"]
    shapes = [(h + 2 * kv, h), (h, h), (2 * m, h), (h, m)]  # qkv, o, gate+up, down: (out, in)
    weights = [torch.randn(o, i, dtype=kind) for o, i in shapes]
    x = torch.randn(tokens, h, dtype=kind)
    y = torch.randn(tokens, m, dtype=kind)

    def layer() -> None:
        for w in weights:
            torch.nn.functional.linear(y if w.shape[1] == m else x, w)

    layer()  # the first call picks kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        layer()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def max_layers(geometry: dict[str, int], dtype: str) -> int:
    """The most layers whose KV for the lane's cache fits the server's KV space, within LANE_LAYERS."""
    per_layer = LANE_KV_TOKENS * 2 * geometry["num_key_value_heads"] * geometry["head_dim"] * DTYPE_BYTES[dtype]
    return min(LANE_LAYERS[1], LANE_KV_BYTES // per_layer)


def lane_sizing() -> tuple[dict[str, int], dict[str, Any]]:
    """The lane model's geometry (its layer count included) and what sized it: the faster of bfloat16 and
    float32 here (bfloat16 wherever the CPU has bfloat16 units, float32 on an AVX2-only one, where bfloat16 is
    emulated ~5x slower), then as many layers of the wide geometry as make a 1024-token prefill take about
    ``LANE_PREFILL_TARGET_MS`` (at least LANE_LAYERS[0]), or, when even that many would take over twice the
    target, as many of the narrow one."""
    wide = SIZES["lane"]
    timed = {dtype: linear_ms(wide, dtype) for dtype in DTYPE_BYTES}
    dtype = min(timed, key=timed.__getitem__)
    per_layer = VLLM_PER_LINEAR * timed[dtype]
    info: dict[str, Any] = {"dtype": dtype, "linear_ms_per_layer_1k": {k: round(v, 2) for k, v in timed.items()}}
    if LANE_LAYERS[0] * per_layer <= 2 * LANE_PREFILL_TARGET_MS:
        layers = max(LANE_LAYERS[0], min(max_layers(wide, dtype), round(LANE_PREFILL_TARGET_MS / per_layer)))
        return {**wide, "num_hidden_layers": layers}, info
    narrow = VLLM_PER_LINEAR * linear_ms(LANE_NARROW, dtype)
    info["narrow_linear_ms_per_layer_1k"] = round(narrow / VLLM_PER_LINEAR, 2)
    layers = max(1, min(max_layers(LANE_NARROW, dtype), round(LANE_PREFILL_TARGET_MS / narrow)))
    return {**LANE_NARROW, "num_hidden_layers": layers}, info


def geometry_of(size: str) -> tuple[dict[str, int], dict[str, Any]]:
    """The LlamaConfig geometry to build for ``size``, and what sized it (the lane model's timing and dtype)."""
    if size != "lane":
        return SIZES[size], {"dtype": "bfloat16"}
    return lane_sizing()


def save_model(out: Path, vocab_size: int, geometry: dict[str, int], dtype: str) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**geometry, max_position_embeddings=16384,
                         vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                         torch_dtype=dtype)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--tokenizer-from", type=Path, help="copy this folder's tokenizer instead of training")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    vocab = copy_tokenizer(args.tokenizer_from, out) if args.tokenizer_from else train_tokenizer(out)
    geometry, sizing = geometry_of(args.size)
    params = save_model(out, vocab, geometry, sizing["dtype"])
    info = {"size": args.size, "config": geometry, **sizing, "vocab_size": vocab, "parameters": params, "seed": SEED,
            "tokenizer_sha256": sha256(out / "tokenizer.json"),
            "weights_sha256": sha256(out / "model.safetensors"),
            "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
