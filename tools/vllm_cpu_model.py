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
``lane``  hidden 512, 4 layers, MLP 1536, 8 heads (4 KV), head_dim 64: 20.8 M parameters, 42 MB. The timing
          lane's model: compute dominates (a 1024-token prefill takes ~0.2 s on one core, a decode step
          several ms), so TTFT is prefill and queueing, not the HTTP frontend.

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
    "lane": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 64},
}
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


def save_model(out: Path, vocab_size: int, size: str) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**SIZES[size], max_position_embeddings=16384,
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
    params = save_model(out, vocab, args.size)
    info = {"size": args.size, "config": SIZES[args.size], "vocab_size": vocab, "parameters": params, "seed": SEED,
            "tokenizer_sha256": sha256(out / "tokenizer.json"),
            "weights_sha256": sha256(out / "model.safetensors"),
            "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
