"""Table configs from a file (``shardwise plan --config FILE``): JSON, or YAML where PyYAML is installed.

The file holds a list of tables, or ``{"tables": [...]}``. Each table: ``name``, ``rows``, ``dim``;
optionally ``features`` (default ``[name]``), ``ids_per_bag`` (the pooling factor: ids per bag of
each feature; default the caller's), ``pooling`` (``sum``/``mean``) and ``data_type``
(``fp32``/``fp16``/``bf16``). TorchRec's names are accepted too: ``num_embeddings``,
``embedding_dim``, ``feature_names``, ``pooling_factor``. Everything is checked before a config is
built, and an error names the file, the table, the field, the rule and a fix.

Example::

    [{"name": "users", "rows": 1000000, "dim": 64, "features": ["user_id"], "ids_per_bag": 1},
     {"name": "items", "rows": 500000, "dim": 64, "features": ["item_id", "last_items"], "ids_per_bag": 20},
     {"name": "country", "rows": 200, "dim": 16}]

    >>> import os, tempfile; from shardwise.embedding import GreedyShardingPlanner
    >>> tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "tables.json")
    >>> with open(path, "w") as f: _ = f.write('[{"name": "country", "rows": 200, "dim": 16, "ids_per_bag": 1}]')
    >>> tables, ids_per_bag = load_table_configs(path)
    >>> tables[0].num_embeddings, tables[0].feature_names, ids_per_bag
    (200, ('country',), {'country': 1.0})
    >>> GreedyShardingPlanner(8, 2**34, ids_per_bag=ids_per_bag).plan(tables)["country"].sharding_type.value
    'data_parallel'
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["load_table_configs"]

_ALIASES = {"num_embeddings": "rows", "embedding_dim": "dim", "feature_names": "features",
            "pooling_factor": "ids_per_bag"}
_FIELDS = ("name", "rows", "dim", "features", "ids_per_bag", "pooling", "data_type")
_EXAMPLE = '[{"name": "users", "rows": 1000000, "dim": 64, "features": ["user_id"], "ids_per_bag": 1}]'


def _read(path: Path):
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: a YAML file needs PyYAML, which is not installed here; install it "
                             f"(pip install pyyaml) or write the same list of tables as JSON, e.g. {_EXAMPLE}") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({e}); fix the syntax") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}); fix the "
                         f"syntax (a list of tables, e.g. {_EXAMPLE})") from None


def _positive_int(where: str, field: str, v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: field {field!r} = {v!r} must be an int >= 1 ({what}); fix the value")
    return v


def _entry(where: str, raw: dict, default_ids: float) -> tuple:
    """(EmbeddingBagConfig, ids per bag) of one table entry, checked field by field."""
    from ..collection.config import EmbeddingBagConfig

    fields = {_ALIASES.get(k, k): v for k, v in raw.items()}
    unknown = [k for k in fields if k not in _FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; the fields are {list(_FIELDS)} (or TorchRec's "
                         f"{sorted(_ALIASES)}); remove or rename them")
    missing = [k for k in ("name", "rows", "dim") if k not in fields]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; every table needs name, rows and dim, e.g. {_EXAMPLE}")
    name = fields["name"]
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(f"{where}: field 'name' = {name!r} must be a non-empty string without dots; fix the name")
    where = f"{where} ({name!r})"
    rows = _positive_int(where, "rows", fields["rows"], "rows of the table")
    dim = _positive_int(where, "dim", fields["dim"], "columns of each row")
    features = fields.get("features", [name])
    if isinstance(features, str) or not isinstance(features, list) or not features \
            or not all(isinstance(f, str) and f for f in features):
        raise ValueError(f"{where}: field 'features' = {features!r} must be a non-empty list of feature names, "
                         f"e.g. [\"user_id\"]; fix the value (or leave it out: the table's name)")
    ids = fields.get("ids_per_bag", default_ids)
    if isinstance(ids, bool) or not isinstance(ids, (int, float)) or not 0 < ids < float("inf"):
        raise ValueError(f"{where}: field 'ids_per_bag' = {ids!r} must be a number > 0 (ids per bag of each "
                         f"feature, the pooling factor); fix the value")
    extra = {k: fields[k] for k in ("pooling", "data_type") if k in fields}
    try:
        cfg = EmbeddingBagConfig(num_embeddings=rows, embedding_dim=dim, name=name, feature_names=features, **extra)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
    return cfg, float(ids)


def load_table_configs(path, default_ids_per_bag: float = 1.0) -> tuple[list, dict]:
    """``(configs, {table name: ids per bag})`` read from ``path`` (JSON, or YAML with PyYAML).

    Raises ValueError naming the file, the table, the field, the rule and a fix.

    Example: see the module's.
    """
    from ..collection.config import check_tables

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config {str(path)!r}: no such file; pass the path of a JSON file listing the "
                         f"tables, e.g. {_EXAMPLE}")
    data = _read(path)
    if isinstance(data, dict) and set(data) == {"tables"}:
        data = data["tables"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: must hold a non-empty list of tables (or {{\"tables\": [...]}}), got "
                         f"{type(data).__name__}; e.g. {_EXAMPLE}")
    tables, ids = [], {}
    for i, raw in enumerate(data):
        where = f"{path}: tables[{i}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where} = {raw!r} must be an object with name, rows and dim; e.g. {_EXAMPLE}")
        cfg, n = _entry(where, raw, default_ids_per_bag)
        tables.append(cfg)
        ids[cfg.name] = n
    try:
        check_tables(tables)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}; rename them so each table and feature appears once") from None
    return tables, ids
