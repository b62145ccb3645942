"""Build the lane's random-weight Llamas and their tokenizer, from local files only.

Run by ``tools/vllm_cpu.py build-model`` with the lane virtualenv's Python (it needs that venv's torch,
transformers and tokenizers)::

    <venv>/bin/python tools/vllm_cpu_model.py OUT_DIR [--size tiny|lane] [--tokenizer-from DIR]

Recipe (docs/vllm-cpu.md): a byte-level BPE (vocabulary 8000) trained with ``tokenizers`` on
the Python standard library's ``*.py`` files (sorted, capped, so that the same Python version gives the same
corpus), wrapped as ``PreTrainedTokenizerFast`` with ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3 and a
plain chat template (``--tokenizer-from`` copies an already trained one instead: the same files); a
``LlamaConfig`` of one of two sizes with random weights from a fixed seed, saved as safetensors in bfloat16:

``tiny``  hidden 128, 2 layers, MLP 256, 4 heads (2 KV), head_dim 32: 2.3 M parameters, 5 MB. The counter
          tests' model: a step is mostly vLLM's own overhead.
``lane``  hidden 512, MLP 1536, 8 heads (4 KV), head_dim 64, and as many layers (4-14) as make a 1024-token
          prefill take ~0.2 s on one core of this machine: 4 layers (20.8 M parameters, 42 MB) on a CPU without
          AMX, 14 (52.2 M, 105 MB) on one with it, where 4 layers prefill 1024 tokens in ~55 ms and decode a
          step in ~3 ms. The timing lane's model: compute dominates (a decode step takes several ms), so TTFT
          is prefill and queueing, not the HTTP frontend, and the lane's cells (their rates, their TTFTs) keep
          the regime they were designed in whatever the CPU. The layer count comes from timing the layer's
          linear maps on 1024 tokens in bfloat16 on one thread (:func:`lane_layers`); the JSON line records it.

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

VOCAB_SIZE = 8000
SEED = 0
CORPUS_CAP_BYTES = 24 * 1024 * 1024  # enough text for 8000 merges; keeps training to seconds on 2 cores
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# The LlamaConfig geometry of each model size (the module docstring says what each is for).
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32},
    # lane: 4 layers here, as many as lane_layers says when built
    "lane": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 64},
}
# The lane model's depth (:func:`lane_layers`): a 1024-token prefill of ~0.2 s on one core, as the lane's cells were
# designed against; at most 14 layers, whose KV for the lane's 4096 blocks of 32 tokens (1.75 GiB) fits the 2 GiB
# of KV space its server is given (tools/vllm_cpu.py server_env).
LANE_PREFILL_TARGET_MS = 200.0
LANE_LAYERS = (4, 14)
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


def linear_ms(geometry: dict[str, int], tokens: int = 1024, repeats: int = 7) -> float:
    """Median time (ms) of one decoder layer's linear maps (q/k/v/o, gate/up/down) on ``tokens`` tokens, in
    bfloat16 on one thread, as the lane server's model worker runs them."""
    import time

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    h, m = geometry["hidden_size"], geometry["intermediate_size"]
    kv = geometry["num_key_value_heads"] * geometry["head_dim"]
    shapes = [(h + 2 * kv, h), (h, h), (2 * m, h), (h, m)]  # qkv, o, gate+up, down: (out, in)
    weights = [torch.randn(o, i, dtype=torch.bfloat16) for o, i in shapes]
    x = torch.randn(tokens, h, dtype=torch.bfloat16)
    y = torch.randn(tokens, m, dtype=torch.bfloat16)

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


def lane_layers(geometry: dict[str, int]) -> tuple[int, float]:
    """(layers, the layer's linear maps in ms): the depth that makes a 1024-token prefill take about
    ``LANE_PREFILL_TARGET_MS`` here, within ``LANE_LAYERS``."""
    per_layer = linear_ms(geometry)
    layers = round(LANE_PREFILL_TARGET_MS / (VLLM_PER_LINEAR * per_layer))
    return max(LANE_LAYERS[0], min(LANE_LAYERS[1], layers)), per_layer


def geometry_of(size: str) -> tuple[dict[str, int], dict[str, float]]:
    """The LlamaConfig geometry to build for ``size``, and what sized it (the lane model's timing)."""
    if size != "lane":
        return SIZES[size], {}
    layers, per_layer = lane_layers(SIZES[size])
    return {**SIZES[size], "num_hidden_layers": layers}, {"linear_ms_per_layer_1k": round(per_layer, 2)}


def save_model(out: Path, vocab_size: int, geometry: dict[str, int]) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**geometry, max_position_embeddings=16384,
                         vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                         torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
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
    params = save_model(out, vocab, geometry)
    info = {"size": args.size, "config": geometry, **sizing, "vocab_size": vocab, "parameters": params, "seed": SEED,
            "tokenizer_sha256": sha256(out / "tokenizer.json"),
            "weights_sha256": sha256(out / "model.safetensors"),
            "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
