"""Run by TorchRec's own interpreter (not by pytest): TorchRec 1.8's qcomm codecs and its
FusedEmbeddingBagCollection on fixed inputs, saved as plain tensors for
tests/embedding/test_vs_torchrec_qcomm_fused.py to compare against shardwise's.

Usage: PYTHONHASHSEED=0 <torchrec venv>/bin/python tests/embedding/torchrec_qcomm_fused_reference.py OUT.pt
Imports torchrec only; nothing of shardwise.
"""

import sys

import torch
import torchrec
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

TABLES = [("t_sum", 12, 4, ["a", "b"], torchrec.PoolingType.SUM), ("t_mean", 7, 8, ["c"], torchrec.PoolingType.MEAN)]
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.05}), "adagrad": (torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-8})}


def batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(3):
        lengths = torch.randint(0, 4, (3 * 5,), generator=g)
        rows = [12] * 10 + [7] * 5
        values = torch.cat([torch.randint(0, r, (int(n),), generator=g) for r, n in zip(rows, lengths)])
        out.append((values, lengths, torch.randn(5, 16, generator=g)))
    return out


def codecs() -> dict:
    x = torch.randn(64, generator=torch.Generator().manual_seed(1)) * torch.logspace(-9, 2, 64)
    out = {"x": x, "keys": sorted(get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16),
                                                            device=torch.device("cpu")))}
    out["fp32_is_none"] = get_qcomm_codecs_registry(QCommsConfig(), device=torch.device("cpu")) is None
    for scale in (None, 512.0):
        reg = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16, forward_loss_scale=scale,
                                                     backward_loss_scale=scale), device=torch.device("cpu"))
        c = reg["POOLED_EMBEDDINGS_ALL_TO_ALL"]
        out[scale] = {"fwd_wire": c.forward.encode(x), "fwd_back": c.forward.decode(c.forward.encode(x)),
                      "bwd_wire": c.backward.encode(x), "bwd_back": c.backward.decode(c.backward.encode(x))}
    return out


def fused() -> dict:
    cfgs = [torchrec.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f, pooling=p)
            for n, r, d, f, p in TABLES]
    torch.manual_seed(5)
    init = {f"embedding_bags.{n}.weight": torch.rand(r, d) for n, r, d, _, _ in TABLES}
    out = {"init": init, "batches": batches()}
    for name, (cls, kwargs) in OPTIMIZERS.items():
        m = FusedEmbeddingBagCollection(cfgs, optimizer_type=cls, optimizer_kwargs=kwargs, device=torch.device("cpu"))
        m.load_state_dict(init)
        outs = []
        for values, lengths, target in out["batches"]:
            kjt = torchrec.KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths)
            kt = m(kjt)
            outs.append(kt.values().detach().clone())
            ((kt.values() - target) ** 2).sum().backward()
        out[name] = {"outputs": outs, "final": {k: v.detach().clone() for k, v in m.state_dict().items()}}
    return out


if __name__ == "__main__":
    torch.save({"codecs": codecs(), "fused": fused()}, sys.argv[1])
