"""`ctrpipe evaluate` refuses a file it cannot measure on, before the model is loaded: one without labels
(the real Kaggle test rows: feature-only lines), or one with more bad lines than a day's ingest allows
(`ingest.max_bad_fraction`).  It printed an AUC on the 89 of 9,999 unlabelled lines that happened to parse.

The registry holds a published version made by hand (`tests.helpers.model_dirs`: fields a and b), so a
file that passes the checks meets the next one: the model's fields are not Criteo's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flows.cli.evaluate_file import evaluate_log
from flows.cli.exit_codes import ExitCode
from flows.config import with_overrides
from flows.presets import demo
from storage.io.registry import ModelRegistry
from tests.helpers.model_dirs import make_model_dir


@pytest.fixture()
def published(tmp_path):
    """A config whose root has a published version (v00001)."""
    cfg = demo(str(tmp_path / "root"))
    candidate, _, _ = make_model_dir(tmp_path / "candidates")
    registry = ModelRegistry(cfg.layout())
    registry.publish(registry.add_version(str(candidate), metrics={}, lineage={}, status="candidate"))
    return cfg


def _lines(shared_data, n: int) -> bytes:
    return b"".join((shared_data / "criteo" / "train_head_10k.tsv").read_bytes().splitlines(keepends=True)[:n])


@pytest.mark.subprocess  # `ctrpipe evaluate` as a user runs it
def test_a_file_without_labels_is_refused_saying_so(shared_data, published):
    unlabelled = str(shared_data / "criteo" / "test_unlabelled_10k.tsv")
    with pytest.raises(ValueError, match="no labels") as raised:
        evaluate_log(published, "latest", unlabelled, "criteo")
    message = str(raised.value)
    assert message.startswith(f"{unlabelled}: no labels: ") and "39 fields, the criteo schema has 40" in message
    assert "ctrpipe score-server" in message


@pytest.mark.subprocess  # `ctrpipe evaluate` as a user runs it
def test_a_file_with_more_bad_lines_than_ingest_allows_is_refused(shared_data, published, tmp_path):
    mixed = tmp_path / "mixed.tsv"
    mixed.write_bytes(_lines(shared_data, 3000) + b"garbage\n" * 40)  # 1.3% bad
    cfg = published
    with pytest.raises(
        ValueError,
        match=r"40 of 3040 lines quarantined \(1\.3%\), more than "
        r"ingest\.max_bad_fraction \(0\.01\): wrong field count x40",
    ) as raised:
        evaluate_log(cfg, "latest", str(mixed), "criteo")
    assert "--set ingest.max_bad_fraction=0.018" in str(raised.value)
    # allowed more bad lines, the file passes and meets the next check
    with pytest.raises(ValueError, match=r"model v00001 was trained on fields \['a', 'b'\]"):
        evaluate_log(with_overrides(cfg, {"ingest.max_bad_fraction": 0.05}), "latest", str(mixed), "criteo")


@pytest.mark.subprocess  # `ctrpipe evaluate` as a user runs it
def test_the_command_exits_failed_with_the_word(shared_data, published):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli.main",
            "evaluate",
            "--input",
            str(shared_data / "criteo" / "test_unlabelled_10k.tsv"),
            "--preset",
            "demo",
            "--set",
            f"root={published.root}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == ExitCode.FAILED and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.startswith("ctrpipe evaluate: error: ") and "no labels" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) <= 2
