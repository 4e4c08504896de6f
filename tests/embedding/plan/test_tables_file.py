"""Table configs from a file: JSON (and YAML where PyYAML is installed), every bad field named."""

import json
import sys

import pytest

from shardwise.embedding import GreedyShardingPlanner, load_table_configs


def _write(tmp_path, data, name="tables.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_json_list_and_torchrec_names(tmp_path):
    p = _write(tmp_path, {"tables": [
        {"name": "users", "rows": 1000, "dim": 64, "features": ["user_id"], "ids_per_bag": 1},
        {"name": "items", "num_embeddings": 5000, "embedding_dim": 32, "feature_names": ["item", "last"],
         "pooling_factor": 20, "pooling": "mean"},
        {"name": "country", "rows": 200, "dim": 16}]})
    tables, ids = load_table_configs(p, default_ids_per_bag=3)
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.feature_names) for t in tables] == [
        ("users", 1000, 64, ("user_id",)), ("items", 5000, 32, ("item", "last")), ("country", 200, 16, ("country",))]
    assert tables[1].pooling == "mean"
    assert ids == {"users": 1.0, "items": 20.0, "country": 3.0}
    # a bare list reads the same; the planner takes the per-table pooling factors
    tables2, ids2 = load_table_configs(_write(tmp_path, json.loads(p.read_text())["tables"], "bare.json"), 3)
    assert tables2 == tables and ids2 == ids
    planner = GreedyShardingPlanner(2, 2**30, ids_per_bag=ids)
    assert set(planner.plan(tables)) == {"users", "items", "country"}


def test_pooling_factor_changes_the_estimate(tmp_path):
    # more ids per bag is more lookup work and more ids to route: the estimate must grow with it
    tables, _ = load_table_configs(_write(tmp_path, [{"name": "a", "rows": 10_000, "dim": 64}]))
    one = GreedyShardingPlanner(2, 2**30, ids_per_bag={"a": 1})
    many = GreedyShardingPlanner(2, 2**30, ids_per_bag={"a": 50})
    plan = {"a": one.plan(tables)["a"]}
    assert max(many.estimate(plan, tables).cost) > max(one.estimate(plan, tables).cost)


@pytest.mark.parametrize("entry, needle", [
    ({"name": "t", "rows": -5, "dim": 8}, r"tables\[0\] \('t'\): field 'rows' = -5 must be an int >= 1"),
    ({"name": "t", "rows": 10, "dim": 2.5}, r"field 'dim' = 2.5 must be an int >= 1"),
    ({"name": "t", "rows": 10}, r"tables\[0\]: missing field\(s\) \['dim'\]"),
    ({"name": "t", "rows": 10, "dim": 8, "colour": 1}, r"unknown field\(s\) \['colour'\]"),
    ({"name": "t", "rows": 10, "dim": 8, "features": "f"}, r"field 'features' = 'f' must be a non-empty list"),
    ({"name": "t", "rows": 10, "dim": 8, "ids_per_bag": 0}, r"field 'ids_per_bag' = 0 must be a number > 0"),
    ({"name": "a.b", "rows": 10, "dim": 8}, r"field 'name' = 'a.b' must be a non-empty string without dots"),
    ({"name": "t", "rows": 10, "dim": 8, "pooling": "max"}, r"tables\[0\] \('t'\): .*pooling"),
])
def test_bad_fields_name_table_field_rule(tmp_path, entry, needle):
    with pytest.raises(ValueError, match=needle) as e:
        load_table_configs(_write(tmp_path, [entry]))
    assert "tables.json" in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"no such file; pass the path of a JSON file"):
        load_table_configs(tmp_path / "missing.json")
    with pytest.raises(ValueError, match=r"not valid JSON at line 2, column"):
        load_table_configs(_write(tmp_path, '[{"name": "t",\n "rows": 10 "dim": 8}]'))
    with pytest.raises(ValueError, match=r"must hold a non-empty list of tables"):
        load_table_configs(_write(tmp_path, {"name": "t"}))
    with pytest.raises(ValueError, match=r"tables\[1\] = 3 must be an object"):
        load_table_configs(_write(tmp_path, [{"name": "t", "rows": 1, "dim": 1}, 3]))
    dup = [{"name": "a", "rows": 9, "dim": 8, "features": ["f"]}, {"name": "b", "rows": 9, "dim": 8, "features": ["f"]}]
    with pytest.raises(ValueError, match=r"feature 'f' is used by tables 'a' and 'b'"):
        load_table_configs(_write(tmp_path, dup))


def test_yaml_without_pyyaml_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)      # import yaml -> ImportError, as where it is absent
    p = _write(tmp_path, "- name: t\n  rows: 10\n  dim: 8\n", "tables.yaml")
    with pytest.raises(ValueError, match=r"tables.yaml: a YAML file needs PyYAML, which is not installed here; "
                                         r"install it \(pip install pyyaml\) or write the same list of tables as JSON"):
        load_table_configs(p)


def test_yaml_with_pyyaml(tmp_path):
    pytest.importorskip("yaml")
    p = _write(tmp_path, "tables:\n- name: t\n  rows: 10\n  dim: 8\n  ids_per_bag: 2\n", "tables.yml")
    tables, ids = load_table_configs(p)
    assert tables[0].num_embeddings == 10 and ids == {"t": 2.0}
