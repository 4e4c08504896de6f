r"""``shardwise export RUN_OR_CHECKPOINT --out DIR``: a trained job's model, unsharded, for serving.

The job's checkpoint is sharded (each rank wrote its shards with ``torch.distributed.checkpoint``).
The export reads it with DCP's own loader on one process (``dcp.load(..., no_dist=True)``: no process
group; DCP assembles every table from the shards of every rank, whatever the plan or world size was),
only the weights (no optimizer state), and writes the folder ``shardwise.serve.standalone`` describes:
``model.json``, ``model.pt`` (a plain state dict), ``vocab/`` (the training vocabulary, checked
against the digest the job recorded) and ``model.py`` (the module definition, plain PyTorch).

Example (after ``shardwise train --out run``)::

    from shardwise.serve import export_model, load_model
    export_model("run", "exported")
    load_model("exported").score(counts, raw_ids)
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from . import standalone

__all__ = ["export_model", "find_checkpoint", "standalone_dense_names"]

_SPARSE, _DENSE = "sparse.embedding_bags.t_", "dense.params."


def find_checkpoint(path) -> Path:
    """A committed checkpoint folder: ``path`` itself, the newest under it, or under ``path/checkpoints``
    (a run's ``--out``); ValueError naming the path and the fix otherwise."""
    from ..train.checkpoint import MARKER, latest

    p = Path(path)
    if (p / MARKER).is_file() and (p / "meta.json").is_file():
        return p
    for root in (p / "checkpoints", p):
        found = latest(root)
        if found is not None:
            return found
    raise ValueError(f"{str(p)!r} holds no committed checkpoint (looked for step_*/COMMITTED in it and in "
                     f"{str(p / 'checkpoints')!r}); train with --checkpoint-every K (a checkpoint is also saved at "
                     f"the last step) and pass its --out, its --checkpoint-dir, or one step_* folder")


def _read_weights(ckpt: Path) -> tuple:
    """(tables {feature: [rows, dim]}, dense params {name: tensor}) read with DCP on this process alone."""
    md = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    state: dict = {"sparse": {}, "dense": {"params": {}}}
    for key, m in md.items():
        if not isinstance(m, TensorStorageMetadata):
            continue
        if key.startswith(_SPARSE) and key.endswith(".weight"):
            state["sparse"][key[len("sparse."):]] = torch.empty(m.size, dtype=m.properties.dtype)
        elif key.startswith(_DENSE):
            state["dense"]["params"][key[len(_DENSE):]] = torch.empty(m.size, dtype=m.properties.dtype)
    if not state["sparse"] or not state["dense"]["params"]:
        raise ValueError(f"{ckpt}: no embedding tables or dense parameters in this checkpoint (not one "
                         f"`shardwise train` wrote?); pass a checkpoint of the train job")
    with warnings.catch_warnings():   # DCP warns that it loads on one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
    tables = {k[len("embedding_bags.t_"):-len(".weight")]: v for k, v in state["sparse"].items()}
    return tables, state["dense"]["params"]


_ZOO = (("dense_arch.model._mlp.", "bottom"), ("over_arch.model.0._mlp.", "top"))


def standalone_dense_names(params: dict) -> dict:
    """The dense parameters under ``model.py``'s names (``bottom.{2i}``/``top.{2i}``: nn.Sequential of
    Linear/ReLU pairs). The job's dense part may also carry TorchRec's DLRM names
    (``dense_arch.model._mlp.{i}._linear``, ``over_arch.model.0._mlp.{i}._linear``, ``over_arch.model.1``);
    those are mapped, so an export reads checkpoints of either.

    Example:
        >>> w = torch.zeros(1)
        >>> zoo = {"dense_arch.model._mlp.1._linear.bias": w, "over_arch.model.0._mlp.0._linear.weight": w,
        ...        "over_arch.model.1.weight": w}
        >>> sorted(standalone_dense_names(zoo))
        ['bottom.2.bias', 'top.0.weight', 'top.2.weight']
    """
    if not any(k.startswith(("dense_arch.", "over_arch.")) for k in params):
        return dict(params)
    out, top_layers = {}, set()
    for key, value in params.items():
        for zoo, name in _ZOO:
            if key.startswith(zoo):
                i, _, kind = key[len(zoo):].partition("._linear.")
                out[f"{name}.{2 * int(i)}.{kind}"] = value
                if name == "top":
                    top_layers.add(int(i))
                break
        else:
            if not key.startswith("over_arch.model.1."):
                raise ValueError(f"dense parameter {key!r} is not part of the job's DLRM dense model; pass a "
                                 f"checkpoint of `shardwise train`")
    last = 2 * (max(top_layers) + 1 if top_layers else 0)
    for kind in ("weight", "bias"):
        if f"over_arch.model.1.{kind}" in params:
            out[f"top.{last}.{kind}"] = params[f"over_arch.model.1.{kind}"]
    return out


def _mlp_widths(params: dict, prefix: str) -> list:
    """[in, hidden..., out] of an nn.Sequential of Linear/ReLU pairs, from its weights' shapes."""
    idx = sorted(int(k.split(".")[1]) for k in params if k.startswith(prefix + ".") and k.endswith(".weight"))
    shapes = [params[f"{prefix}.{i}.weight"].shape for i in idx]
    return [int(shapes[0][1])] + [int(s[0]) for s in shapes]


def _vocabulary(meta: dict, vocab_dir: Optional[str]):
    """The training vocabulary (None: the job folded raw ids), checked against the digest it recorded."""
    from ..data import read_manifest
    from ..data.vocab import vocab_of_folder

    cfg = json.loads(meta["config"])
    digest = meta.get("vocab_digest")
    data = vocab_dir or cfg.get("data")
    if not data or not Path(str(data).split(",")[0]).is_dir():
        if digest:
            raise ValueError(f"the run trained on {cfg.get('data')!r} with vocabulary {digest[:19]}..., which is not "
                             f"there any more; pass --vocab PREPARED_DIR (that folder, or one prepared with its "
                             f"--vocab)")
        return None
    folder = str(data).split(",")[0]
    vocab = vocab_of_folder(folder, read_manifest(folder))
    if digest and (vocab is None or vocab.digest != digest):
        raise ValueError(f"--vocab {folder}: its vocabulary ({vocab.digest[:19] + '...' if vocab else 'none'}) is not "
                         f"the one the run trained with ({digest[:19]}...); pass the training folder")
    if vocab is not None and None in vocab.oov_rows:
        raise ValueError(f"{folder} was prepared by an older shardwise (no out-of-vocabulary row for every feature), "
                         f"so an exported model could not map ids it never saw; prepare it again with --categorify "
                         f"and train again")
    return vocab


def export_model(source, out, vocab: Optional[str] = None, int8: bool = False) -> dict:
    """Write the unsharded model of ``source`` (a run's ``--out``, a checkpoint folder or one step_*
    folder) into the new folder ``out``; return its ``model.json`` contents. ``vocab``: the prepared
    training folder when it moved since training (checked against the run's digest). ``int8``: the
    tables row-wise quantized to uint8 with a float scale and bias per row (a quarter of the bytes;
    the MLPs stay float32)."""
    from ..train.checkpoint import read_meta

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty folder; pass a new folder")
    ckpt = find_checkpoint(source)
    meta = read_meta(ckpt)
    voc = _vocabulary(meta, vocab)
    tables, dense = _read_weights(ckpt)
    dense = standalone_dense_names(dense)
    features = [f"C{i + 1}" for i in range(26)]
    missing = [f for f in features if f not in tables]
    if missing:
        raise ValueError(f"{ckpt}: no table for {missing}; pass a checkpoint of the train job")
    sizes = [int(tables[f].shape[0]) for f in features]
    if voc is not None and [min(a, b) for a, b in zip(voc.table_sizes, sizes)] != sizes:
        raise ValueError(f"{ckpt}: table sizes {sizes} do not fit the vocabulary's {voc.table_sizes}; pass the "
                         f"training folder as --vocab")
    spec = {"format": standalone.FORMAT, "version": 1, "dense_features": [f"I{i + 1}" for i in range(13)],
            "sparse_features": features, "table_sizes": sizes, "dim": int(tables["C1"].shape[1]),
            "bottom": _mlp_widths(dense, "bottom"), "top": _mlp_widths(dense, "top"), "pooling": "sum",
            "dense_transform": "log1p(max(count, 0)); a missing count is 0",
            "ids": "vocabulary" if voc is not None else "modulo",
            "id_rule": ("row = index of the raw id in vocab/<feature>.npy, any other id -> oov_rows[feature], then "
                        "row % rows" if voc is not None else "row = raw id % rows") + "; a missing id: an empty bag",
            "oov_rows": voc.oov_rows if voc is not None else None, "vocab_digest": voc.digest if voc else None,
            "output": "logit; click probability = sigmoid(logit)",
            "checkpoint": str(ckpt.resolve()), "step": meta.get("step"),
            "table_dtype": "int8_rowwise" if int8 else "float32"}
    state = {}
    for f in features:
        if int8:
            state[f"tables.{f}.qweight"], state[f"tables.{f}.scale_bias"] = standalone.quantize_rowwise(tables[f])
        else:
            state[f"tables.{f}.weight"] = tables[f]
    state.update({k: v for k, v in dense.items()})
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        model = standalone.ClickModel(spec)
        model.load_state_dict(state)   # the shapes fit the module definition, or nothing is written
        torch.save(state, out / "model.pt")
        if voc is not None:
            voc.save(out)
        shutil.copyfile(standalone.__file__, out / "model.py")
        (out / "model.json").write_text(json.dumps(spec, indent=1) + "\n")   # last: a folder with it is complete
    except BaseException:   # nothing half-written stays behind
        shutil.rmtree(out)
        if not created:
            out.mkdir()
        raise
    return spec
