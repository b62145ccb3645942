"""Latency models: how long one engine step takes, and the per-request frontend time around it.

Every model reduces to the same compiled form, :class:`StepModel`: two weight vectors over the six
per-step features the step loop computes (``FEATURES``), the step time being

    step_us = max(1, max(compute · F, memory · F))

and a frontend term added to each request's TTFT and E2E (API server, tokenisation, detokenisation
and streaming: time outside the engine core, which does not occupy the engine):

    frontend_us = frontend_base_us + frontend_per_inflight_us · (requests in the system at arrival)
                  + (wait for admission)

The admission wait: the API server takes requests in one at a time, ``frontend_admission_us`` each
(parsing, tokenising, handing to the engine), so a request sent while earlier ones are still being
taken in waits for them: a burst of N sent at once has its k-th request wait k · admission, while
spread-out arrivals wait for nothing. It is what makes TTFT grow along a burst, which a per-request-
in-flight term would also fit on a probe but then charges to every request of a busy Poisson stream.

Models:

* **linear** (:class:`LatencyCoefficients`, read from a small YAML/JSON file with
  :func:`load_coefficients`, written by ``blis fit``): ``base + per_prefill_token · Tp +
  per_decode_seq · Td + per_context_token · Cd + per_prefill_context · Cp + per_prefill_attention · Ap``
  (linear in its coefficients; Ap makes prefill superlinear in the prompt, as attention is;
  ``per_prefill_context`` defaults to ``per_context_token``); ``memory`` is zero.
* **roofline-fit** (the same file with ``model: roofline-fit`` and a ``memory:`` row,
  :class:`MemoryCoefficients`; ``blis fit --step-shape roofline``): ``base + max(the linear terms
  without the base, weights + per_context_token · (Cd + Cp))``, for a server with a
  compute/memory knee; both rows carry the base.
* **roofline** (:func:`roofline`): from a model's local ``config.json`` (:func:`load_model_config`,
  no downloads) and the bundled hardware table (``hardware.json``: H100, H200, A100, L40S), a compute
  roofline (FLOPs over peak × MFU per phase) against a memory roofline (weights + KV read/write over
  peak bandwidth).

``StepModel.describe()`` is the provenance record written into every output (design D7).
:class:`LatencyModel` is what the simulator needs of a model (the step loop its weights, the outputs
its frontend term and description); :class:`StepModel` is the one implementation, and
:class:`StepModelSource` a model in another form that compiles to one (the coefficient file's).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from blis_sim._lazy import lazy_exports
from blis_sim.errors import ConfigError, FormatError
from blis_sim.formats._strict import read_text

if TYPE_CHECKING:  # coefficients.py imports this module
    from blis_sim.engine.coefficients import FrontendCoefficients

#: Per-step features, in the order of the weight vectors. Tp: prompt tokens computed this step;
#: Td: decode sequences; Cd: context tokens the decodes attend to; Cp: context already computed
#: before each prefill chunk (summed); Ap: attention pairs of the prefill chunks,
#: Σ t·seq + t(t+1)/2 (quadratic in the chunk, used by the roofline only).
FEATURES = ("one", "prefill_tokens", "decode_seqs", "decode_context", "prefill_context",
            "prefill_attention")
N_FEATURES = len(FEATURES)

#: The default when no coefficient file is given: a linear fit to the reference's bundled
#: trained-physics step times for Qwen3-14B on one H100 (docs/reference-formats.md §7.2 worked table), with
#: its 15.6 ms per-request queueing constant as the frontend base. A starting point, not a calibration.
#: Plain values here; :data:`DEFAULT_COEFFICIENTS` (the model, built on first use) and
#: :func:`default_step_model` (no pydantic model built: the replay path) both come from them.
_DEFAULT_STEP = {"base_us": 12000.0, "per_prefill_token_us": 4.6, "per_decode_seq_us": 4.5,
                 "per_context_token_us": 0.095, "per_prefill_attention_us": 0.0}
_DEFAULT_FRONTEND = {"base_us": 15563.0, "per_inflight_us": 0.0}


# The coefficient-file models live in :mod:`blis_sim.engine.coefficients` (pydantic): what a
# replay without ``--latency-coefficients`` never builds. Their names are still served from here.
_COEFFICIENT_NAMES = frozenset({"CoefficientEstimate", "FitIteration", "FitReport",
                                "FrontendCoefficients", "LatencyCoefficients", "MemoryCoefficients",
                                "StepCoefficients", "DEFAULT_COEFFICIENTS", "load_coefficients",
                                "dump_coefficients"})


__getattr__ = lazy_exports(__name__, {"blis_sim.engine.coefficients": tuple(sorted(_COEFFICIENT_NAMES))})[0]


@runtime_checkable  # tests check each implementation against it
class LatencyModel(Protocol):
    """A latency model as the simulator uses it: the step loop reads :meth:`weights` (a step takes
    ``max(1, max(compute · F, memory · F))`` µs over the features ``F``, ``FEATURES``); the frontend
    term adds ``frontend_base_us + frontend_per_inflight_us · in-flight + admission wait`` to each
    request's TTFT and E2E; :meth:`describe` is the provenance record (design D7)."""

    @property
    def kind(self) -> str: ...

    @property
    def frontend_base_us(self) -> float: ...

    @property
    def frontend_per_inflight_us(self) -> float: ...

    @property
    def frontend_admission_us(self) -> float: ...

    def weights(self) -> np.ndarray:
        """(2, N_FEATURES) float64: the compute row, then the memory row."""
        ...

    def step_time(self, features: np.ndarray) -> float: ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable  # tests check each implementation against it
class StepModelSource(Protocol):
    """A model in another form (a fitted coefficient file) that compiles to a :class:`StepModel`."""

    def to_step_model(self) -> StepModel: ...


@dataclass(frozen=True)
class StepModel:
    """The compiled form every latency model reduces to (see the module docstring)."""

    kind: str
    compute: tuple[float, ...]
    memory: tuple[float, ...]
    frontend_base_us: float = 0.0
    frontend_per_inflight_us: float = 0.0
    frontend_admission_us: float = 0.0
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.compute) != N_FEATURES or len(self.memory) != N_FEATURES:
            raise ValueError(f"a StepModel needs {N_FEATURES} weights per roofline")

    def weights(self) -> np.ndarray:
        """(2, N_FEATURES) float64 array: compute row, memory row (what the step loop reads)."""
        return np.array([self.compute, self.memory], dtype=np.float64)

    def step_time(self, features: np.ndarray) -> float:
        """Step time for one feature vector (the loop computes the same thing inline)."""
        w = self.weights()
        return max(1.0, float(w[0] @ features), float(w[1] @ features))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.kind, **self.details}
        out["frontend"] = {"base_us": self.frontend_base_us,
                           "per_inflight_us": self.frontend_per_inflight_us}
        if self.frontend_admission_us:  # absent when 0: outputs of earlier models stay as they were
            out["frontend"]["admission_us"] = self.frontend_admission_us
        return out


def _linear_step_model(step: dict[str, float], frontend_base_us: float,
                       frontend_per_inflight_us: float,
                       memory: dict[str, float] | None = None, *,
                       frontend_admission_us: float = 0.0) -> StepModel:
    """A linear model's StepModel, or with ``memory`` (a roofline-fit's memory row) the two-row one."""
    prefill_context = step.get("per_prefill_context_us")
    if prefill_context is None:
        prefill_context = step["per_context_token_us"]
    compute = (step["base_us"], step["per_prefill_token_us"], step["per_decode_seq_us"],
               step["per_context_token_us"], prefill_context, step["per_prefill_attention_us"])
    # unset coefficients are left out: the provenance of earlier models' outputs stays as it was
    details: dict[str, Any] = {"step": {k: v for k, v in step.items() if v is not None}}
    row: tuple[float, ...] = (0.0,) * N_FEATURES
    if memory is not None:
        # the base (per-step overhead) is outside the max: it is in both rows
        row = (step["base_us"] + memory["weights_us"], 0.0, 0.0, memory["per_context_token_us"],
               memory["per_context_token_us"], 0.0)
        details["memory"] = dict(memory)
    return StepModel(kind="roofline-fit" if memory is not None else "linear", compute=compute,
                     memory=row, frontend_base_us=frontend_base_us,
                     frontend_per_inflight_us=frontend_per_inflight_us,
                     frontend_admission_us=frontend_admission_us, details=details)


def default_step_model() -> StepModel:
    """``DEFAULT_COEFFICIENTS.to_step_model()``, without building a pydantic model."""
    return _linear_step_model(_DEFAULT_STEP, _DEFAULT_FRONTEND["base_us"],
                              _DEFAULT_FRONTEND["per_inflight_us"])


# --------------------------------------------------------------------------------------------
# Roofline


@dataclass(frozen=True)
class ModelGeometry:
    """What the roofline needs from a Hugging Face ``config.json``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    bytes_per_param: float
    weight_bytes_per_param: float

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param / tp


@dataclass(frozen=True)
class Hardware:
    name: str
    tflops: float
    bandwidth_tbs: float
    mfu_prefill: float
    mfu_decode: float
    memory_gib: float


_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "fp8": 1.0, "float8_e4m3fn": 1.0}


def load_model_config(path: str | Path) -> ModelGeometry:
    """Parse a local HF ``config.json``; a missing or bad field is a ConfigError naming it."""
    p = Path(path)
    try:
        cfg = json.loads(read_text(p))
    except RecursionError:
        raise FormatError("invalid JSON: nested too deeply", file=str(p)) from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"invalid JSON: {exc.msg}", file=str(p), line=exc.lineno) from None
    if not isinstance(cfg, dict):
        raise FormatError("expected a JSON object", file=str(p))
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers nest the LM
        cfg = cfg["text_config"]

    def need(key: str) -> int:
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"needs a positive integer, got {value!r}", file=str(p), field=key)
        return value

    layers, hidden, heads = need("num_hidden_layers"), need("hidden_size"), need("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r} (known: {sorted(_DTYPE_BYTES)})", file=str(p),
                          field="torch_dtype")
    bpp = _DTYPE_BYTES[dtype]
    wbpp = bpp
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        bits = quant.get("bits") or (8 if "fp8" in str(quant.get("quant_method", "")) else None)
        if isinstance(bits, int) and bits > 0:
            wbpp = bits / 8.0
    return ModelGeometry(layers=layers, hidden=hidden, heads=heads, kv_heads=int(kv_heads),
                         head_dim=int(head_dim), intermediate=need("intermediate_size"),
                         vocab=need("vocab_size"), bytes_per_param=bpp, weight_bytes_per_param=wbpp)


@lru_cache(maxsize=1)
def hardware_table() -> dict[str, Hardware]:
    raw = json.loads((Path(__file__).with_name("hardware.json")).read_text())
    return {k: Hardware(name=k, **v) for k, v in raw.items() if not k.startswith("_")}


def get_hardware(name: str) -> Hardware:
    table = hardware_table()
    key = name.upper()
    if key not in table:
        raise ConfigError(f"unknown hardware {name!r} (known: {', '.join(sorted(table))})",
                          field="hardware")
    return table[key]


def roofline(geom: ModelGeometry, hw: Hardware, tp: int = 1,
             frontend: FrontendCoefficients | None = None) -> StepModel:
    """A compute-vs-memory roofline step model for a dense decoder (SwiGLU MLP, GQA attention),
    over the whole batch: ``step = max(compute · F, memory · F)`` (docs/engine.md, "Roofline").

    vLLM runs one forward pass over the flattened batch, so every token it computes, decode or
    prefill, is a row of the same GEMMs: linear-layer FLOPs are priced at one GEMM efficiency
    (``mfu_prefill``), plus the LM head for each decode sequence; attention is 4·q_dim FLOPs per
    (new token, attended token) pair. Memory: every weight once per step, plus the KV written for
    new tokens and read for the context. The hardware table's ``mfu_decode`` is not used: a
    small decode batch is memory bound (weights / bandwidth) and needs no compute derating, and
    pricing each decode token at it made a 256-sequence batch 1.5× too slow, which a saturated
    replay turns into an unbounded queue.
    """
    if tp < 1:
        raise ConfigError(f"tensor parallel degree must be ≥ 1, got {tp}", field="tp")
    t = roofline_terms(geom, hw, tp)
    compute = (0.0, t.prefill_token_us, t.decode_seq_us, t.attention_pair_us, 0.0,
               t.attention_pair_us)
    kv = t.kv_token_us
    memory = (t.weights_us, kv, kv, kv, kv, 0.0)
    if frontend is None:
        from blis_sim.engine.coefficients import FrontendCoefficients  # it imports this module

        frontend = FrontendCoefficients()
    fe = frontend
    g = geom
    details = {"hardware": hw.name, "tp": tp,
               "model_config": {"layers": g.layers, "hidden": g.hidden, "heads": g.heads,
                                "kv_heads": g.kv_heads, "head_dim": g.head_dim,
                                "intermediate": g.intermediate, "vocab": g.vocab,
                                "bytes_per_param": g.bytes_per_param,
                                "weight_bytes_per_param": g.weight_bytes_per_param}}
    return StepModel(kind="roofline", compute=compute, memory=memory,
                     frontend_base_us=fe.base_us, frontend_per_inflight_us=fe.per_inflight_us,
                     frontend_admission_us=fe.admission_us, details=details)


@dataclass(frozen=True)
class RooflineTerms:
    """The roofline's unit costs, µs: what one step's compute and memory rows are made of, and
    what the fit's physics prior is built from."""

    weights_us: float          # reading every weight once (memory)
    kv_token_us: float         # reading or writing one token's KV (memory)
    prefill_token_us: float    # one token through the linear layers (compute)
    decode_seq_us: float       # one decode token through the linear layers and the LM head
    attention_pair_us: float   # one (new token, attended token) attention pair (compute)


def roofline_terms(geom: ModelGeometry, hw: Hardware, tp: int = 1) -> RooflineTerms:
    g = geom
    q_dim, kv_dim = g.heads * g.head_dim, g.kv_heads * g.head_dim
    layer_params = g.hidden * (q_dim + 2 * kv_dim) + q_dim * g.hidden + 3 * g.hidden * g.intermediate
    lin_flops = g.layers * 2.0 * layer_params / tp
    head_flops = 2.0 * g.hidden * g.vocab / tp
    attn_flops = g.layers * 4.0 * q_dim / tp
    gemm_per_us = hw.tflops * 1e12 / 1e6 * hw.mfu_prefill
    bw_per_us = hw.bandwidth_tbs * 1e12 / 1e6
    params = g.layers * layer_params + g.vocab * g.hidden
    return RooflineTerms(weights_us=params * g.weight_bytes_per_param / tp / bw_per_us,
                         kv_token_us=g.kv_bytes_per_token(tp) / bw_per_us,
                         prefill_token_us=lin_flops / gemm_per_us,
                         decode_seq_us=(lin_flops + head_flops) / gemm_per_us,
                         attention_pair_us=attn_flops / gemm_per_us)

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.engine.coefficients import (
        DEFAULT_COEFFICIENTS as DEFAULT_COEFFICIENTS,
        CoefficientEstimate as CoefficientEstimate,
        FitIteration as FitIteration,
        FitReport as FitReport,
        FrontendCoefficients as FrontendCoefficients,
        LatencyCoefficients as LatencyCoefficients,
        MemoryCoefficients as MemoryCoefficients,
        StepCoefficients as StepCoefficients,
        dump_coefficients as dump_coefficients,
        load_coefficients as load_coefficients,
    )
