"""Run by TorchRec's own interpreter (not by pytest): TorchRec 1.8's planner on a model with
collections at "sparse.ebc" and at the root, every table constrained to one sharding type; prints
the plan's shape as JSON for tests/embedding/plan/test_torchrec_planner.py.

Usage: PYTHONHASHSEED=0 <torchrec venv>/bin/python tests/embedding/plan/torchrec_plan_reference.py
Imports torchrec only; nothing of shardwise.
"""

import json

import torch
import torchrec
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology


def _ebc():
    return torchrec.EmbeddingBagCollection(tables=[
        torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=r, feature_names=[f"f{i}"])
        for i, r in enumerate((100, 50000, 3000))], device=torch.device("meta"))


def main() -> None:
    model = torch.nn.Module()
    model.sparse = torch.nn.ModuleDict({"ebc": _ebc()})
    model.over = torch.nn.Linear(4, 1)
    constraints = {"t0": ParameterConstraints(sharding_types=["table_wise"]),
                   "t1": ParameterConstraints(sharding_types=["column_wise"]),
                   "t2": ParameterConstraints(sharding_types=["data_parallel"])}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints)
    out = {}
    for name, module in (("nested", model), ("root", _ebc())):
        plan = planner.plan(module, [torchrec.distributed.embeddingbag.EmbeddingBagCollectionSharder()])
        out[name] = {path: {t: ps.sharding_type for t, ps in per.items()} for path, per in plan.plan.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
