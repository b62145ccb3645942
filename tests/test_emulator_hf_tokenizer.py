"""--tokenizer: a model's own Hugging Face tokenizer and chat template in the emulator (and observe's offline
prompts), on a byte-level BPE trained here with a BOS post-processor and a chat template of its own. The same
against the lane's tiny model and the real vLLM: tests/clients/test_vllm_parity.py."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from blis_sim.emulator import EmulatorConfig, start_emulator
from blis_sim.emulator.hf_tokenizer import NO_TEMPLATE, load_hf_tokenizer
from blis_sim.emulator.tokenizer import BUILTIN_NOTE
from blis_sim.errors import ConfigError
from blis_sim.observe.prompts import VOCABULARY

TEXT = ("The scheduler admits waiting requests in arrival order while the token budget lasts; cached blocks "
        "are reused when a new request shares the prefix of an earlier one, and evicted in order.")
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def build(folder: Path, *, template: str | None = TEMPLATE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # observe's vocabulary words too, so that some of them are one token (as in a real model's vocabulary)
    tok.train_from_iterator([TEXT] * 20 + [" " + " ".join(VOCABULARY)] * 20, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False}}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("hf") / "my-model")


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[httpx.Client]:
    config = EmulatorConfig(profile="zero", model="my-model", tokenizer=str(model_dir))
    with start_emulator(config) as emu, httpx.Client(base_url=emu.url, timeout=10) as c:
        yield c


def test_loads_from_the_folder_or_its_tokenizer_json(model_dir: Path) -> None:
    a, b = load_hf_tokenizer(model_dir), load_hf_tokenizer(model_dir / "tokenizer.json")
    assert a.encode_prompt(TEXT, add_special_tokens=True) == b.encode_prompt(TEXT, add_special_tokens=True)
    assert a.encode_prompt("hi", add_special_tokens=True)[0] == 1  # its post-processor's BOS
    assert a.eos_token_id == 2 and a.root == model_dir.resolve() and "its chat template" in a.describe()


@pytest.mark.parametrize("where", ["missing", "no tokenizer.json", "corrupt"])
def test_a_bad_path_is_a_clear_error(tmp_path: Path, where: str) -> None:
    path = tmp_path / "nope"
    if where == "no tokenizer.json":
        path.mkdir()
    elif where == "corrupt":
        path.mkdir()
        (path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError) as exc:
        load_hf_tokenizer(path)
    assert exc.value.location.field == "tokenizer" and str(path) in str(exc.value)


def test_config_checks_the_path_and_refuses_add_bos(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as missing:
        EmulatorConfig(tokenizer=str(tmp_path / "absent"))
    assert missing.value.location.field == "tokenizer"
    with pytest.raises(ConfigError) as both:
        EmulatorConfig(tokenizer=str(model_dir), add_bos=True)
    assert both.value.location.field == "add_bos"


def test_the_command_says_what_is_wrong(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "blis_sim.emulator", "--port", "0", "--tokenizer",
                           str(tmp_path / "absent")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "tokenizer" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_counts_are_the_tokenizers(client: httpx.Client, model_dir: Path) -> None:
    tok = load_hf_tokenizer(model_dir)
    ids = tok.encode_prompt(TEXT, add_special_tokens=True)
    assert client.post("/tokenize", json={"prompt": TEXT}).json()["tokens"] == ids
    r = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 6}).json()
    assert r["usage"]["prompt_tokens"] == len(ids) and r["usage"]["completion_tokens"] == 6
    # generated words re-encode to themselves: the answer costs what it cost to generate
    assert len(tok.encode_prompt(r["choices"][0]["text"], add_special_tokens=False)) == 6
    plain = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 1, "add_special_tokens": False})
    assert plain.json()["usage"]["prompt_tokens"] == len(ids) - 1


def test_chat_goes_through_the_models_template(client: httpx.Client, model_dir: Path) -> None:
    tok = load_hf_tokenizer(model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]
    text = "[system] Be brief.\n[user] " + TEXT + "\n[assistant]"
    assert tok.render_chat(messages, add_generation_prompt=True) == text
    ids = tok.encode_prompt(text, add_special_tokens=False)  # vLLM: the template writes special tokens
    assert client.post("/tokenize", json={"messages": messages}).json()["tokens"] == ids
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3}).json()
    assert r["usage"]["prompt_tokens"] == len(ids)


def test_detokenize_keeps_special_tokens(client: httpx.Client, model_dir: Path) -> None:
    ids = load_hf_tokenizer(model_dir).encode_prompt("in order", add_special_tokens=True)
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "<s>in order"}


def test_models_name_the_tokenizer(client: httpx.Client, model_dir: Path) -> None:
    (card,) = client.get("/v1/models").json()["data"]
    assert card["root"] == str(model_dir.resolve()) and str(model_dir) in card["blis_tokenizer"]
    with start_emulator(EmulatorConfig(profile="zero")) as emu:
        (builtin,) = httpx.get(emu.url + "/v1/models").json()["data"]
    assert builtin["blis_tokenizer"] == BUILTIN_NOTE and builtin["root"] == "tiny-llama"


def test_a_model_without_a_template_refuses_chat_as_vllm(tmp_path: Path) -> None:
    folder = build(tmp_path / "bare", template=None)
    with start_emulator(EmulatorConfig(profile="zero", tokenizer=str(folder))) as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == NO_TEMPLATE


def test_a_template_that_raises_is_a_400(tmp_path: Path) -> None:
    folder = build(tmp_path / "strict", template="{{ raise_exception('only user turns') }}")
    with start_emulator(EmulatorConfig(profile="zero", tokenizer=str(folder))) as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "only user turns"


@pytest.mark.parametrize("api_format", ["completions", "chat"])
def test_observe_builds_exact_prompts_offline(client: httpx.Client, model_dir: Path, api_format: str) -> None:
    import aiohttp

    from blis_sim.observe.client import Target
    from blis_sim.observe.prompts import calibrate_prompts

    url = str(client.base_url).rstrip("/")

    async def build_prompts() -> object:
        async with aiohttp.ClientSession() as session:
            return await calibrate_prompts(session, Target(url, "my-model", api_format, "", 10.0),
                                           use_tokenize=False, tokenizer=str(model_dir))

    builder = asyncio.run(build_prompts())
    assert builder.mode == "exact" and builder.describe().startswith("exact (tokenizer ")  # type: ignore[attr-defined]
    for length in (40, 100, 333):  # above the chat template's own tokens
        text = builder.text(list(range(length)))  # type: ignore[attr-defined]
        body = {"messages": [{"role": "user", "content": text}]} if api_format == "chat" else {"prompt": text}
        assert client.post("/tokenize", json=body).json()["count"] == length
