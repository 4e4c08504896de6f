"""A plain user script, one rank of a 2-rank gloo job (the test starts the ranks, as torchrun would).

A sharded matmul with DTensors, backward, ``full_tensor()``, then ``destroy_process_group()``; the
mesh and tensors stay alive in module globals until the interpreter exits, as in most scripts.
Prints the number of this process's threads before ``init_process_group`` and in the last at-exit
handler (registered first, so it runs after every other one, right before finalization).

``python _exit_script.py shardwise|torch STORE_FILE`` with RANK and WORLD_SIZE in the environment.
"""
import atexit
import os
import sys


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


BEFORE = _threads()
atexit.register(lambda: print(f"threads before init {BEFORE} at exit {_threads()}", flush=True))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if sys.argv[1] == "shardwise":
    from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
else:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
w = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]).requires_grad_()
x = distribute_tensor(torch.randn(6, 8), mesh, [Shard(1)])
y = x @ w
y.sum().backward()
grad, out = w.grad.full_tensor(), y.full_tensor()
dist.destroy_process_group()
