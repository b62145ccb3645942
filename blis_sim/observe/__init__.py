"""`blis observe`: dispatch a workload to a vLLM server, capture a TraceV2, scrape the KV counters.

Library API (what the pytest plugin uses; no argv involved)::

    from blis_sim.observe import ObserveOptions, observe, observe_async, write_result

    opts = ObserveOptions(model="tiny-llama", scrape_kv_metrics=True, vllm_commit=sha)
    result = observe("http://127.0.0.1:8000", spec, opts)        # spec: WorkloadSpec or WorkloadPlan
    result.trace                  # formats.trace.Trace (header with observed_kv_metrics + pytest_blis block)
    result.warnings               # scrape misses, prompt-length drift, prewarm failures
    result.interrupted            # Ctrl-C / SIGTERM (handle_signals=True): trace marked partial
    result.lateness_ms            # actual − scheduled send time per request
    write_result(result, "trace.yaml", "trace.csv", blis_compatible=False, itl_path=None)

Modules: ``run`` (orchestration: version, prompt calibration, prewarm, phases, counter window,
header), ``dispatch`` (schedule, concurrency, follow-ups, stop), ``client`` (one request, timed, over
``http1`` or aiohttp), ``http1`` (the lean keep-alive HTTP/1.1 client of the hot path), ``loop`` (uvloop, with
the stdlib fallback), ``sse`` (framing and chunk interpretation), ``prompts`` (server-exact prompt text),
``metrics`` (``/metrics`` parsing and windowed hit-rates for every definition of design D2),
``scrape`` (HTTP scrapes and the counter window with its settle delays and miss warnings),
``capture`` (records → trace rows, summaries), ``progress`` (TTY progress line), ``cli``
(``register(subparsers)``). The names above are imported lazily so that ``blis --help`` and
``blis calibrate`` do not pay for aiohttp.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ObserveOptions", "ObserveResult", "observe", "observe_async", "write_result"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from blis_sim.observe import run

        return getattr(run, name)
    raise AttributeError(f"module 'blis_sim.observe' has no attribute {name!r}")

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.observe.run import (
        ObserveOptions as ObserveOptions,
        ObserveResult as ObserveResult,
        observe as observe,
        observe_async as observe_async,
        write_result as write_result,
    )
