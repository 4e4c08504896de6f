r"""Every rank fails together when one rank's reader meets a bad line (no rank left in a collective).

A rank's reader raises only on its own rows (a malformed line lies in one rank's stripe), so the
other ranks would go on into the next step's collectives and wait there until the timeout.
``AgreedReader.batch`` reads, then all ranks all-reduce one flag; when any rank failed, all ranks
gather the messages and raise the same ValueError, naming the rank(s) and their errors.

Example:
    >>> from shardwise.data import open_click_logs
    >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
    >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
    >>> rank, world, step = dist.get_rank(), dist.get_world_size(), 0
    >>> data = AgreedReader(open_click_logs(path, rank, world), device=torch.device("cpu"))
    >>> b = data.batch(step * 512, 512)      # on every rank, at the same step
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["AgreedReader"]


class AgreedReader:
    r"""Wraps a reader (``batch(start, count)``) so a ValueError on any rank is raised on every rank.

    ``device`` is where the flag lives for the all-reduce (the job's device: ``cuda:LOCAL_RANK``
    under NCCL, CPU under gloo); ``group`` defaults to the whole world. Every rank must call
    ``batch`` the same number of times (as a training step does). Costs one all-reduce of one int
    per call. Other attributes (``bad_lines``, ``num_rows``, ...) are the wrapped reader's.

    Example:
        >>> from shardwise.data import open_click_logs
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> with open(path, "a") as f: _ = f.write("not a click log line\n")
        >>> AgreedReader(open_click_logs(path), torch.device("cpu")).batch(0, 8)   # "cuda" under NCCL
        Traceback (most recent call last):
        ValueError: reading click logs failed on 1 of 1 rank(s), so every rank stops here: rank 0: day_0.tsv line 5: ...
    """

    def __init__(self, reader, device: torch.device, group: Optional[dist.ProcessGroup] = None):
        self.reader, self.device, self.group = reader, torch.device(device), group

    def __getattr__(self, name):
        if name == "reader":      # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.reader, name)

    def batch(self, start: int, count: int):
        """The wrapped reader's batch, or the same ValueError on every rank when any rank's read failed."""
        error: Optional[str] = None
        out = None
        try:
            out = self.reader.batch(start, count)
        except ValueError as e:
            error = str(e)
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, group=self.group)
        if int(flag.item()) == 0:
            return out
        # every rank saw the flag, so every rank enters this gather
        messages: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(messages, error, group=self.group)
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        detail = "; ".join(f"rank {r}: {m}" for r, m in failed)
        raise ValueError(f"reading click logs failed on {len(failed)} of {len(messages)} rank(s), so every "
                         f"rank stops here: {detail}")
