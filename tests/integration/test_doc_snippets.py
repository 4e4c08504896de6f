"""Every ```python snippet in README.md and docs/*.md runs, on 2 real processes (torchrun, gloo).

A snippet that calls ``init_process_group`` is a whole script and runs first; the others run inside the
group it (or the runner) started, each in a fresh namespace.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP: dict = {}
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

_RUNNER = r'''
import json, sys, traceback
import torch.distributed as dist

blocks = json.load(open(sys.argv[1]))
failed = []
for where, code in blocks:
    if not dist.is_initialized() and "init_process_group(" not in code:
        dist.init_process_group("gloo")
    try:
        exec(compile(code, where, "exec"), {"__name__": "__main__"})
    except Exception:
        failed.append(where)
        print(f"SNIPPET FAILED {where} on rank {dist.get_rank() if dist.is_initialized() else '?'}:\n"
              f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        break   # the other ranks may be waiting in a collective of this snippet: stop all of it
    if dist.get_rank() == 0:   # to a file: a snippet's own output may leave a partial line on stdout
        with open(sys.argv[2], "a") as fh:
            fh.write(f"SNIPPET OK {where}\n")
if not failed:
    dist.barrier()
    dist.destroy_process_group()
sys.exit(1 if failed else 0)
'''


def snippets() -> list:
    """``[(file:line, code)]`` of every python block, scripts (that start the group) first."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        rel = str(path.relative_to(ROOT))
        if rel in SKIP:
            continue
        text = path.read_text()
        for m in _BLOCK.finditer(text):
            out.append((f"{rel}:{text[:m.start()].count(chr(10)) + 1}", m.group(1)))
    return sorted(out, key=lambda b: "init_process_group(" not in b[1])


def test_the_snippets_are_found():
    found = {where.split(":")[0] for where, _ in snippets()}
    assert {"README.md", "docs/compile.md", "docs/embedding.md", "docs/parallel.md"} <= found, found
    assert snippets()[0][0].startswith("README.md")   # the script that starts its own group goes first


def test_every_snippet_runs_on_two_processes(tmp_path):
    blocks = snippets()
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "runner.py").write_text(_RUNNER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(tmp_path / "runner.py"), str(tmp_path / "blocks.json"), str(tmp_path / "ok.txt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    done = (tmp_path / "ok.txt").read_text() if (tmp_path / "ok.txt").exists() else ""
    ok = [line.split()[-1] for line in done.splitlines() if line.startswith("SNIPPET OK")]
    assert proc.returncode == 0 and ok == [w for w, _ in blocks], proc.stderr[-6000:]
