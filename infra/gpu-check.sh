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
#    train_step (torch.cuda.set_sync_debug_mode), a per-phase step profile, examples/s fp32/bf16 with
#    and without the device cache and on CPU, determinism, device-cache restore memory.
# 4. one CLI day (`ctrpipe generate` + `ctrpipe run`) on cuda, then the same day on cpu.
# 5. trainer variants from that day's train spec: 2 gloo ranks sharing the GPU; 2 NCCL ranks on one
#    GPU (refused at launch, naming both numbers).
# Knobs: OUT (default gpu-check-out), WORK (scratch, default $TMPDIR/ctr-gpu-check), WHEELHOUSE,
# ROWS (rows of the synthetic day, 200000), BUDGET_S (450: later steps are skipped past it), PYTHON.
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
echo "install rc=$?"; tail -3 "$OUT/install.log"
"$VPY" -c 'import torch; assert torch.cuda.is_available(), "the venv sees no CUDA"; print("venv torch", torch.__version__)' \
    || { say "!! no CUDA in the venv: stopping"; exit 1; }
export PATH="$VENV/bin:$PATH"

say "2. the store's CUDA conformance tests"
timeout "$(( $(left) > 120 ? 120 : 60 ))" "$VPY" -m pytest -p no:cacheprovider -q -rs \
    tests/storage/embedding/test_device_cache.py tests/storage/embedding/test_memory.py \
    --junitxml="$OUT/storage.xml" > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/tests.log"
grep -q 'classname="[^"]*Cuda\|\[cuda\]' "$OUT/storage.xml" && ! grep -q 'no CUDA device' "$OUT/tests.log" \
    || say "!! the CUDA conformance tests did not run"

say "3. the probe"
timeout -k 5 "$(( $(left) - 200 > 60 ? $(left) - 200 : 60 ))" "$VPY" -m bench.gpu_probe --device cuda \
    --out "$OUT/probe.json" --budget-s "$(( $(left) - 230 > 40 ? $(left) - 230 : 40 ))" > "$OUT/probe.log" 2>&1
echo "probe rc=$?"; grep '^\[probe\]' "$OUT/probe.log" | cut -c1-300

cli_day() {  # DEVICE BACKEND
    PREFECT_HOME="$WORK/prefect-$1" timeout -k 10 "$(( $(left) > 150 ? 120 : 60 ))" ctrpipe run --date "$DATE" \
        --set "root=$WORK/root-$1" --set "input.url=$WORK/raw/day_{date}.tsv.gz" --set "trainer.device=$1" \
        --set "trainer.backend=$2" --set trainer.checkpoint_every=0 --set trainer.log_every=25 \
        > "$OUT/cli-$1.log" 2>&1
    echo "ctrpipe run on $1: rc=$?"
    "$VPY" - "$WORK/root-$1/runs/ctr/date=$DATE" <<'PY'
import json, sys
try:
    m = json.load(open(f"{sys.argv[1]}/metrics.json")); t = json.load(open(f"{sys.argv[1]}/model/model.json"))["train"]
    print(json.dumps({"auc": m.get("auc"), "examples_per_s": t.get("examples_per_s"), "device": t.get("device"),
                      "backend": t.get("backend"), "world_size": t.get("world_size"), "prefetch": t.get("prefetch_depth")}))
except Exception as e:  # noqa: BLE001
    print("no record:", e)
PY
}
if (( $(left) > 100 )); then
    say "4. one CLI day on cuda, then on cpu ($ROWS rows)"
    ctrpipe generate --out "$WORK/raw" --days 1 --rows-per-day "$ROWS" --seed 0 --start-date "$DATE" > "$OUT/cli-generate.log" 2>&1
    cli_day cuda auto
    (( $(left) > 60 )) && cli_day cpu gloo
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
    cat "$OUT/variants.log" | grep -E '^(gloo2|nccl2)'
fi
say "done in $(( $(date +%s) - START ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
