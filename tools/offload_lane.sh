#!/usr/bin/env bash
# The real offload lane (docs/vllm-cpu.md, "Offload tiers"): for each offload file of scenarios/lane/offload/, a
# tiny-model vLLM 0.32 serving its own OffloadingConnector as that file says (tools/vllm_cpu_offload.py), and the
# scenario file of the same name judged against it: every hit-rate definition and tier within 1 pp, every
# request's cached tokens equal. Usage: bash tools/offload_lane.sh [ARTIFACTS_DIR] [CONFIG ...]
# (configs: cpu tiered policy threshold full faults stale; default all). "faults" serves tiered.yaml with every
# 3rd fs store failing (offload-faults.blis.yaml); "stale" observes twice on one fs root (below). One server at a
# time; each is stopped by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-blis-artifacts/offload-lane}
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(cpu tiered policy threshold full faults stale)
# An fs root that still holds an earlier run's files: the same prompts observed by two servers in turn, the
# second started on the first one's fs root. Its tier's file names are content hashes, so the second window's
# first sightings hit on disk; observe must say so in the header (a warm_start fault) and calibrate must fail
# the window on it rather than on the simulator.
stale=$out/stale
observe_twice() {
    local run=$1 url
    python tools/vllm_cpu.py stop >/dev/null 2>&1 || true
    url=$(python tools/vllm_cpu.py start --enforce-eager --offload-config scenarios/lane/offload/tiered.yaml \
          --fs-root "$stale/root") || return 1
    python -m blis_sim observe --server-url "$url" --model tiny-llama --prefix-tokens 1024 --prompt-tokens 64 \
        --output-tokens 4 --num-requests 4 --rate 2 --seed 7 --scrape-kv-metrics --no-progress \
        --trace-header "$stale/$run.yaml" --trace-data "$stale/$run.csv" || return 1
    python tools/vllm_cpu.py stop
}
stale_root() {
rm -rf "$stale"; mkdir -p "$stale/root"
echo "=== offload lane: stale fs root ($stale/root)"
if observe_twice first && observe_twice second; then
    python - "$stale" <<'PY' || return 1
import sys
from blis_sim.formats.trace import read_trace_header
d = sys.argv[1]
first, second = (read_trace_header(f"{d}/{run}.yaml") for run in ("first", "second"))
warm = lambda h: [f for f in (h.pytest_blis.faults if h.pytest_blis else []) if f.kind == "warm_start"]
assert not warm(first), f"the first window, on an empty fs root, is a warm start: {warm(first)}"
assert warm(second) and warm(second)[0].count >= 1, "the second window, on the first one's fs root, is no warm start"
print(f"stale fs root: first window clean, second: {warm(second)[0].detail}")
PY
else
    return 1
fi
}
trap 'python tools/vllm_cpu.py stop' EXIT
status=0
for cfg in "${configs[@]}"; do
    if [ "$cfg" = stale ]; then stale_root || status=$?; continue; fi
    file=scenarios/lane/offload/$cfg.yaml
    fault=()
    if [ "$cfg" = faults ]; then file=scenarios/lane/offload/tiered.yaml; fault=(--fail-fs-store-every 3); fi
    python tools/vllm_cpu.py stop >/dev/null 2>&1 || true
    url=$(python tools/vllm_cpu.py start --enforce-eager --offload-config "$file" "${fault[@]}")
    echo "=== offload lane: $cfg ($file) at $url"
    python -m pytest --blis-server-url "$url" --blis-kv-offload-config "$file" --blis-kv-bytes-per-token 512 \
        --blis-timing-report-only "scenarios/lane/offload-$cfg.blis.yaml" -q -p no:cacheprovider \
        --blis-artifacts-dir "$out/$cfg" || status=$?
done

exit "$status"
