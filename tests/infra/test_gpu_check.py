"""`make gpu-check` (infra/gpu-check.sh): valid bash, and everything it runs exists in the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "gpu-check.sh"


@pytest.mark.subprocess  # bash -n
def test_the_gpu_check_is_valid_bash_run_by_make() -> None:
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^gpu-check:\n\tbash infra/gpu-check\.sh$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)


def test_what_the_gpu_check_runs_exists() -> None:
    text = SCRIPT.read_text()
    tests = re.findall(r"tests/[\w/]+\.py", text)
    assert tests and all((REPO / t).is_file() for t in tests), tests
    modules = re.findall(r"-m (bench\.\w+)", text)
    assert modules == ["bench.gpu_probe"] and (REPO / "bench" / "gpu_probe.py").is_file()
    assert "--system-site-packages" in text and "--no-index --find-links" in text, (
        "installs over the host's torch, offline"
    )


FAKE_PYTHON = r"""#!/usr/bin/env bash
# A host's python for infra/gpu-check.sh: canned answers, per $SCENARIO (ok or bad), for what needs CUDA.
case "$1" in
  -c) echo "fake torch, cuda available"; exit 0 ;;
  -m)
    case "$2" in
      venv) mkdir -p "${@: -1}/bin" && cp "$0" "${@: -1}/bin/python"; exit 0 ;;
      pip) exit 0 ;;
      pytest)
        xml=$(printf '%s\n' "$@" | sed -n 's/^--junitxml=//p')
        skip=$([ "$SCENARIO" = ok ] || echo '<skipped message="no CUDA device"/>')
        case="<testcase classname=\"T\" name=\"test_x[cuda]\">$skip</testcase>"
        echo "<testsuites><testsuite>$case</testsuite></testsuites>" > "$xml"
        exit 0 ;;
      bench.gpu_probe)
        out=$(printf '%s\n' "$@" | sed -n '/^--out$/{n;p}')
        status=$([ "$SCENARIO" = ok ] && echo ok || echo error)
        echo "{\"sync_free_step\": {\"status\": \"$status\"}}" > "$out"
        [ "$SCENARIO" = ok ]; exit $? ;;
    esac ;;
  -)
    script=$(mktemp); cat > "$script"
    if grep -q run_training "$script"; then
      echo 'gloo2 {"rc": 0, "examples_per_s": 1}'; echo "nccl2 refused/failed: 2 ranks on a node with 1 visible GPU(s)"
      exit 0
    fi
    shift; exec "$REAL_PYTHON" "$script" "$@" ;;
esac
echo "fake python: unexpected $*" >&2; exit 2
"""
FAKE_CTRPIPE = r"""#!/usr/bin/env bash
# `ctrpipe run --set root=R --set trainer.device=D ...` leaves the day's record and the train spec step 5 reads.
for a; do case $a in root=*) root=${a#root=} ;; trainer.device=*) dev=${a#trainer.device=} ;; esac; done
[ "$1" = run ] || exit 0
day="$root/runs/ctr/date=2026-01-01" && mkdir -p "$day/model" && echo '{}' > "$day/train-spec.json"
echo '{"auc": 0.7}' > "$day/metrics.json" && echo "{\"train\": {\"device\": \"$dev:0\"}}" > "$day/model/model.json"
"""


@pytest.mark.subprocess  # runs the script with a fake python and ctrpipe
@pytest.mark.parametrize("scenario", ["ok", "bad"])
def test_the_gpu_check_exits_non_zero_naming_what_failed_or_was_skipped(tmp_path: Path, scenario: str) -> None:
    """`make gpu-check` passes only when every step ran and passed: skipped CUDA tests and a step that waited for
    the GPU under set_sync_debug_mode("error") fail it, each named."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in (("python", FAKE_PYTHON), ("ctrpipe", FAKE_CTRPIPE)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "PYTHON": str(stubs / "python"),
        "REAL_PYTHON": sys.executable,
        "SCENARIO": scenario,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "HOME": str(tmp_path),
    }
    out = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    log = out.stdout + out.stderr
    if scenario == "ok":
        assert out.returncode == 0 and "every step passed" in log, log
        return
    assert out.returncode == 1, log
    assert "the CUDA conformance tests did not all run" in log
    assert "the probe (rc=1" in log and "waited for the GPU under set_sync_debug_mode('error')" in log
