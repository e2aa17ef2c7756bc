#!/usr/bin/env bash
# The checks of ctr-pipeline on a host with an NVIDIA GPU and no network: `make gpu-check` from the
# repository root (or `bash infra/gpu-check.sh`).  They need CUDA; nothing here has run on a GPU yet
# (README "Not exercised here").
#
#   OUT=gpu-check-out WHEELHOUSE=/path/to/wheels make gpu-check
#
# 1. install: a venv over the host's own CUDA torch (--system-site-packages), the project installed
#    offline from WHEELHOUSE (`make wheelhouse DIR=... PYVER=3.12` on a machine with network); without
#    WHEELHOUSE the host must already have the other dependencies (--no-deps).
# 2. the store's CUDA conformance tests (DeviceCache[cuda], MemoryStore on CUDA): bit for bit under
#    deterministic algorithms, within tolerance without; fails when they were skipped.
# 3. the probe (bench/gpu_probe.py): ranks vs GPUs, a one-rank NCCL smoke, the sync audit of one
#    train_step (torch.cuda.set_sync_debug_mode "warn", host store and CUDA default), the CUDA default's
#    step between log points under set_sync_debug_mode("error") (`sync_free_step`: any wait for the GPU
#    fails it; tests/trainer/test_step_host_reads.py counts none on CPU), a per-phase step profile,
#    examples/s fp32/bf16 with and without the device cache and on CPU, determinism, restore memory.
# 4. one CLI day (`ctrpipe generate` + `ctrpipe run`) on cuda, then the same day on cpu.
# 5. trainer variants from that day's train spec: 2 gloo ranks sharing the GPU; 2 NCCL ranks on one
#    GPU (refused at launch, naming both numbers).
# Knobs: OUT (default gpu-check-out), WORK (scratch, default $TMPDIR/ctr-gpu-check), WHEELHOUSE,
# ROWS (rows of the synthetic day, 200000), BUDGET_S (450: later steps are skipped past it), PYTHON.
# Exit status: 0 only when every step ran and passed; 1 names each step that failed, was skipped (the time
# budget) or did not run what it checks (CUDA tests skipped, a probe section in error).
set -uo pipefail

REPO="$(pwd)"
[[ -f pyproject.toml && -d trainer ]] || { echo "run from the ctr-pipeline repository root" >&2; exit 2; }
OUT="$(mkdir -p "${OUT:-$REPO/gpu-check-out}" && cd "${OUT:-$REPO/gpu-check-out}" && pwd)"
WORK="${WORK:-${TMPDIR:-/tmp}/ctr-gpu-check}"
ROWS="${ROWS:-200000}"
BUDGET_S="${BUDGET_S:-450}"
PY="${PYTHON:-python3}"
DATE=2026-01-01
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
say() { echo "[gpu-check +$(( $(date +%s) - START ))s] $*"; }
FAILED=()
fail() { FAILED+=("$*"); say "!! $*"; }
rm -rf "$WORK" && mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp" PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false CTRPIPE_TRACEBACK=1
unset PREFECT_API_URL RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
exec > >(tee -a "$OUT/run.log") 2>&1

say "0. preflight"
timeout 20 nvidia-smi 2>&1 | head -15 || echo "nvidia-smi missing"
"$PY" -c 'import torch, torch.distributed as d; print("host torch", torch.__version__, "cuda", torch.version.cuda,
    "available", torch.cuda.is_available(), "gpus", torch.cuda.device_count(), "nccl", d.is_nccl_available())'

say "1. install over the host's torch (WHEELHOUSE=${WHEELHOUSE:-none})"
VENV="$WORK/venv"
"$PY" -m venv --system-site-packages "$VENV" && VPY="$VENV/bin/python" || VPY="$PY"
if [[ -n "${WHEELHOUSE:-}" ]]; then
    "$VPY" -m pip install --no-index --find-links "$WHEELHOUSE" -e . > "$OUT/install.log" 2>&1
else
    "$VPY" -m pip install --no-index --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
fi
rc=$?; echo "install rc=$rc"; tail -3 "$OUT/install.log"
(( rc == 0 )) || fail "1. install (rc=$rc)"
"$VPY" -c 'import torch; assert torch.cuda.is_available(), "the venv sees no CUDA"; print("venv torch", torch.__version__)' \
    || { say "!! no CUDA in the venv: stopping"; exit 1; }
export PATH="$VENV/bin:$PATH"

say "2. the store's CUDA conformance tests"
timeout "$(( $(left) > 120 ? 120 : 60 ))" "$VPY" -m pytest -p no:cacheprovider -q -rs \
    tests/storage/embedding/test_device_cache.py tests/storage/embedding/test_memory.py \
    --junitxml="$OUT/storage.xml" > "$OUT/tests.log" 2>&1
rc=$?; echo "pytest rc=$rc"; tail -4 "$OUT/tests.log"
(( rc == 0 )) || fail "2. the store's tests failed (rc=$rc)"
"$VPY" - "$OUT/storage.xml" <<'PY' || fail "2. the CUDA conformance tests did not all run"
import sys, xml.etree.ElementTree as ET
cases = [c for c in ET.parse(sys.argv[1]).iter("testcase") if "cuda" in c.get("name", "").lower()]
skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
print(f"cuda tests: {len(cases)}, skipped: {len(skipped)} {skipped[:5]}")
sys.exit(0 if cases and not skipped else 1)
PY

say "3. the probe"
timeout -k 5 "$(( $(left) - 200 > 60 ? $(left) - 200 : 60 ))" "$VPY" -m bench.gpu_probe --device cuda \
    --out "$OUT/probe.json" --budget-s "$(( $(left) - 230 > 40 ? $(left) - 230 : 40 ))" > "$OUT/probe.log" 2>&1
rc=$?; echo "probe rc=$rc"; grep '^\[probe\]' "$OUT/probe.log" | cut -c1-300
(( rc == 0 )) || fail "3. the probe (rc=$rc: a section in error or skipped, probe.json)"
"$VPY" - "$OUT/probe.json" <<'PY' || fail "3. the CUDA default's step waited for the GPU under set_sync_debug_mode('error')"
import json, sys
s = json.load(open(sys.argv[1])).get("sync_free_step", {"status": "missing"})
print("sync_free_step:", json.dumps(s)[:600])
sys.exit(0 if s.get("status") == "ok" else 1)
PY

cli_day() {  # DEVICE BACKEND
    PREFECT_HOME="$WORK/prefect-$1" timeout -k 10 "$(( $(left) > 150 ? 120 : 60 ))" ctrpipe run --date "$DATE" \
        --set "root=$WORK/root-$1" --set "input.url=$WORK/raw/day_{date}.tsv.gz" --set "trainer.device=$1" \
        --set "trainer.backend=$2" --set trainer.checkpoint_every=0 --set trainer.log_every=25 \
        > "$OUT/cli-$1.log" 2>&1
    local rc=$?; echo "ctrpipe run on $1: rc=$rc"
    (( rc == 0 )) || fail "4. the CLI day on $1 (rc=$rc, cli-$1.log)"
    "$VPY" - "$WORK/root-$1/runs/ctr/date=$DATE" "$1" <<'PY' || fail "4. the CLI day on $1 left no record, or trained elsewhere"
import json, sys
try:
    m = json.load(open(f"{sys.argv[1]}/metrics.json")); t = json.load(open(f"{sys.argv[1]}/model/model.json"))["train"]
except Exception as e:  # noqa: BLE001
    sys.exit(f"no record: {e}")
print(json.dumps({"auc": m.get("auc"), "examples_per_s": t.get("examples_per_s"), "device": t.get("device"),
                  "backend": t.get("backend"), "world_size": t.get("world_size"), "prefetch": t.get("prefetch_depth"),
                  "attention_kernel": t.get("attention_kernel")}))
sys.exit(0 if str(t.get("device", "")).startswith(sys.argv[2]) else f"trained on {t.get('device')}, not {sys.argv[2]}")
PY
}
if (( $(left) > 100 )); then
    say "4. one CLI day on cuda, then on cpu ($ROWS rows)"
    ctrpipe generate --out "$WORK/raw" --days 1 --rows-per-day "$ROWS" --seed 0 --start-date "$DATE" > "$OUT/cli-generate.log" 2>&1
    cli_day cuda auto
    if (( $(left) > 60 )); then cli_day cpu gloo; else fail "4. the CLI day on cpu: skipped (time budget)"; fi
else
    fail "4. the CLI days: skipped (time budget)"
fi

SPEC="$WORK/root-cuda/runs/ctr/date=$DATE/train-spec.json"
if [[ -f "$SPEC" ]] && (( $(left) > 40 )); then
    say "5. trainer variants from $SPEC"
    "$VPY" - "$SPEC" "$WORK" > "$OUT/variants.log" 2>&1 <<'PY'
import dataclasses, json, sys
from trainer.launch.torchrun import TrainingError, run_training
from trainer.launch.spec import TrainSpec
spec, work = TrainSpec.read(sys.argv[1]), sys.argv[2]
for name, over in (("gloo2", {"nproc_per_node": 2, "backend": "gloo", "device": "cuda", "timeout_s": 90}),
                   ("nccl2", {"nproc_per_node": 2, "backend": "nccl", "device": "cuda", "timeout_s": 60})):
    s = dataclasses.replace(spec, trainer=dataclasses.replace(spec.trainer, **over), output_url=f"{work}/var-{name}/model",
                            local_dir=f"{work}/var-{name}/local", checkpoint_url=None, run_tag=f"{spec.run_tag}-{name}")
    try:
        r = run_training(s, work_dir=f"{work}/var-{name}")
        print(name, json.dumps({"rc": 0, "examples_per_s": r.examples_per_s, "backend": r.stats.get("backend")}))
    except (TrainingError, ValueError) as e:
        print(name, "refused/failed:", str(e).splitlines()[0][:300])
PY
    grep -E '^(gloo2|nccl2)' "$OUT/variants.log"
    grep -q '^gloo2 {"rc": 0' "$OUT/variants.log" || fail "5. two gloo ranks sharing the GPU did not train"
    grep -q '^nccl2 refused/failed:.*GPU' "$OUT/variants.log" || fail "5. two NCCL ranks on one GPU were not refused"
else
    fail "5. the trainer variants: skipped (no train spec from step 4, or the time budget)"
fi
say "done in $(( $(date +%s) - START ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
if (( ${#FAILED[@]} )); then
    say "FAILED (${#FAILED[@]}):"; printf '  %s\n' "${FAILED[@]}"
    exit 1
fi
say "every step passed"
