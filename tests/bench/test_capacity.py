"""bench.capacity: the hardware of both scenarios, per row format, from whatever results are present."""

from __future__ import annotations

from bench import capacity
from storage.embedding.ssd.disk_format import RecordLayout


def test_every_scenario_is_planned_for_each_row_format_and_ssd_bytes_follow_the_record(tmp_path, capsys) -> None:
    capacity.main(["--results", str(tmp_path)])  # no result files: every input falls back and says so
    out = capsys.readouterr().out
    names = [f.name for f in capacity.FORMATS]
    assert names[0] == "adam/fp32" and {"adam/int8/log8", "rowwise_adagrad/int8"} <= set(names)
    assert all(f"| {n} (" in out for n in names)  # one column per format
    inputs = capacity.load_inputs(tmp_path, None)
    s = capacity.SCENARIOS[1]
    ssd = {
        f.name: next(x.value for x in capacity.plan(s, inputs, 2.0, f) if x.what == "SSD bytes per node")
        * next(x.value for x in capacity.plan(s, inputs, 2.0, f) if x.what == "nodes")
        for f in capacity.FORMATS
    }
    for f in capacity.FORMATS:
        assert ssd[f.name] == s.keys * RecordLayout.of(f).record_bytes * inputs["space_amplification"].value
    assert ssd["adam/int8/log8"] < ssd["adam/fp32"] / 3  # 64-byte records against 204
    assert ssd["rowwise_adagrad/int8"] < ssd["adam/fp32"] / 5  # 36
