"""Running a reference script under TorchRec's own interpreter, for the tests that compare with TorchRec.

The interpreter is $SHARDWISE_TORCHREC_PYTHON or ../torchrec-venv/bin/python next to the repository (built by
shared/peers/torchrec-venv.sh); without one the calling test is skipped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

# default: a venv beside the checkout (torchrec-venv.sh ../torchrec-venv), never a machine-specific path
_BESIDE = Path(__file__).resolve().parents[2] / "torchrec-venv" / "bin" / "python"
PEER = Path(os.environ.get("SHARDWISE_TORCHREC_PYTHON", str(_BESIDE)))


def run_reference(script: Path, *args) -> str:
    """``script`` run by the TorchRec interpreter (PYTHONHASHSEED=0 as TorchRec's tests need, and no
    PYTHONPATH, so it imports TorchRec's torch, not ours); returns its stdout."""
    if not PEER.exists():
        pytest.skip(f"no TorchRec interpreter at {PEER} (set SHARDWISE_TORCHREC_PYTHON; "
                    f"shared/peers/torchrec-venv.sh builds one)")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(PEER), str(script), *map(str, args)], check=True, env=env, timeout=300,
                          capture_output=True, text=True).stdout


def load_reference(script: Path, out_dir: Path):
    """What ``script OUT.pt`` saved with torch.save, run under the TorchRec interpreter."""
    out = out_dir / "ref.pt"
    run_reference(script, out)
    return torch.load(out, weights_only=False)
