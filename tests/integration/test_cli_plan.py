"""`shardwise plan`: tables from --config, N equal tables, or the train job's; --calibration; errors."""

import json
import sys

from shardwise.cli import main
from shardwise.embedding import Calibration
from shardwise.train.budget import table_sizes
from shardwise.train.data import default_cardinalities

TABLES = [{"name": "users", "rows": 100_000, "dim": 64, "features": ["user_id"], "ids_per_bag": 1},
          {"name": "items", "rows": 50_000, "dim": 64, "features": ["item_id", "last_item"], "ids_per_bag": 20},
          {"name": "country", "rows": 200, "dim": 16}]


def _plan_json(capsys, *args) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_from_a_config_file(tmp_path, capsys):
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": TABLES}))
    rec = _plan_json(capsys, "--config", str(path), "--world", "8", "--ranks-per-host", "4")
    assert [(t["name"], t["rows"], t["dim"]) for t in rec["tables"]] == [(t["name"], t["rows"], t["dim"]) for t in TABLES]
    assert rec["world_size"] == 8 and rec["hosts"] == ["0-3", "4-7"]
    assert rec["estimated_step_ms"] == max(rec["estimated_step_ms_per_rank"]) > 0
    assert "not a measurement" in rec["estimate_note"] and rec["calibration"] == Calibration.nominal().to_json()
    # the text form prints the estimate as an estimate
    assert main(["plan", "--config", str(path), "--world", "2"]) == 0
    out = capsys.readouterr().out
    assert "users" in out and "estimated embedding time per step" in out and "an estimate, not a measurement" in out


def test_plan_with_a_recorded_calibration(tmp_path, capsys):
    cal = Calibration(lookup_s_per_call=1e-5, lookup_s_per_id=2e-8, lookup_s_per_byte=1e-10,
                      all_to_all_s_per_byte=1e-9, all_to_all_s_per_message=1e-4, all_reduce_s_per_byte=1e-9,
                      all_reduce_s_per_message=1e-4, source="measured on rank 0", world_size=2, device="cpu")
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"steps": 10, "calibration": cal.to_json()}))
    rec = _plan_json(capsys, "--tables", "4", "--rows", "1000", "--calibration", str(metrics))
    assert Calibration.from_json(rec["calibration"]) == cal
    assert rec == _plan_json(capsys, "--tables", "4", "--rows", "1000", "--calibration", str(metrics))


def test_rows_means_the_largest_table_as_in_train(capsys):
    # no --tables, no --config: the 26 tables `shardwise train --rows 4000` builds, planned with the job's types
    rec = _plan_json(capsys, "--rows", "4000")
    assert [t["rows"] for t in rec["tables"]] == table_sizes(default_cardinalities(4000), None, None)
    assert max(t["rows"] for t in rec["tables"]) == 4000
    assert {t["sharding"] for t in rec["tables"]} <= {"table_wise", "row_wise", "data_parallel"}
    # --tables N: N tables, each of --rows rows (each one the largest)
    rec = _plan_json(capsys, "--tables", "3", "--rows", "4000", "--dim", "8")
    assert [(t["rows"], t["dim"]) for t in rec["tables"]] == [(4000, 8)] * 3


def test_plan_errors_name_the_value_and_the_fix(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "users", "rows": -5, "dim": 64}]))
    assert main(["plan", "--config", str(bad)]) == 2
    assert "tables[0] ('users'): field 'rows' = -5 must be an int >= 1" in capsys.readouterr().err
    assert main(["plan", "--config", str(bad), "--tables", "3"]) == 2
    assert "--config gives the tables, so --tables would be ignored" in capsys.readouterr().err
    assert main(["plan", "--rows", "5"]) == 2
    assert "--rows=5 must be >= 8" in capsys.readouterr().err
    assert main(["plan", "--tables", "2", "--sharding-types", "diagonal"]) == 2
    assert "--sharding-types='diagonal' must list some of" in capsys.readouterr().err
    assert main(["plan", "--tables", "2", "--calibration", str(bad)]) == 2
    assert "--calibration" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "yaml", None)
    y = tmp_path / "tables.yaml"
    y.write_text("- name: t\n  rows: 10\n  dim: 8\n")
    assert main(["plan", "--config", str(y)]) == 2
    assert "pip install pyyaml" in capsys.readouterr().err
