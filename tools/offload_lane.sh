#!/usr/bin/env bash
# The real offload lane (docs/vllm-cpu.md, "Offload tiers"): for each offload file of scenarios/lane/offload/, a
# tiny-model vLLM 0.32 serving its own OffloadingConnector as that file says (tools/vllm_cpu_offload.py), and the
# scenario file of the same name judged against it: every hit-rate definition and tier within 1 pp, every
# request's cached tokens equal. Usage: bash tools/offload_lane.sh [ARTIFACTS_DIR] [CONFIG ...]
# (configs: cpu tiered policy threshold; default all). One server at a time; each is stopped by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-blis-artifacts/offload-lane}
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(cpu tiered policy threshold)
trap 'python tools/vllm_cpu.py stop' EXIT
status=0
for cfg in "${configs[@]}"; do
    file=scenarios/lane/offload/$cfg.yaml
    python tools/vllm_cpu.py stop >/dev/null 2>&1 || true
    url=$(python tools/vllm_cpu.py start --enforce-eager --offload-config "$file")
    echo "=== offload lane: $cfg ($file) at $url"
    python -m pytest --blis-server-url "$url" --blis-kv-offload-config "$file" --blis-kv-bytes-per-token 512 \
        --blis-timing-report-only "scenarios/lane/offload-$cfg.blis.yaml" -q -p no:cacheprovider \
        --blis-artifacts-dir "$out/$cfg" || status=$?
done
exit "$status"
