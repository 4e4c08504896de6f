"""Every docstring example (``>>>``) in ``shardwise/`` runs, with doctest, in one world-1 gloo process.

The examples run in a subprocess, so nothing they do (a process group, a seed, a setting) touches the
pytest process, and it is killed if it outlives the timeout (a hung collective fails, not hangs).
``__main__`` modules are skipped: importing one runs its command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180
# a launcher's variables in pytest's environment must not reach the runner's world-1 group; the
# examples of cli.worker_environment show the variable it sets where it was not set before
_SCRUBBED_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "THP_MEM_ALLOC_ENABLE"}

_RUNNER = r'''
import doctest, importlib, io, json, os, pkgutil, sys
import torch, torch.distributed as dist

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
torch.set_num_threads(1)
# an in-process store: no port to find or to lose to another process
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

package = sys.argv[1]
pkg = importlib.import_module(package)
names = [package] + sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")
                           if not m.name.endswith(".__main__"))
flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
result = {"modules": names, "run": 0, "skipped": 0, "failed": []}
for name in names:
    try:
        mod = importlib.import_module(name)
        tests = doctest.DocTestFinder().find(mod, name, module=mod)
    except Exception as e:   # an import error, or a docstring doctest cannot parse
        result["failed"].append({"test": name, "where": name, "output": f"{type(e).__name__}: {e}"})
        continue
    for test in tests:
        if not test.examples:
            continue
        skipped = sum(1 for ex in test.examples if ex.options.get(doctest.SKIP))
        out = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=flags)
        runner.run(test, out=out.write)
        result["run"] += runner.tries
        result["skipped"] += skipped
        if runner.failures:
            result["failed"].append({"test": test.name, "output": out.getvalue(),
                                     "where": f"{test.filename}:{'?' if test.lineno is None else test.lineno + 1}"})
dist.destroy_process_group()
with open(sys.argv[2], "w") as fh:
    json.dump(result, fh)
'''


def run_examples(package: str, tmp_path: Path, pythonpath: str) -> dict:
    """Run every docstring example under ``package``; the runner's result, or fail with its stderr."""
    (tmp_path / "runner.py").write_text(_RUNNER)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_VARS}
    work = tmp_path / "cwd"     # examples that write files (in the folder or in tempfile's) write them here
    work.mkdir()
    env.update(PYTHONPATH=pythonpath, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TMPDIR=str(work))
    try:
        proc = subprocess.run([sys.executable, str(tmp_path / "runner.py"), package,
                               str(tmp_path / "result.json")], cwd=work, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the docstring examples of {package} ran past {TIMEOUT_S} s "
                             f"(a hung collective?); their output:\n{e.stdout}\n{e.stderr}") from None
    assert proc.returncode == 0, f"the runner failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads((tmp_path / "result.json").read_text())


def describe(failed: list) -> str:
    return "\n".join(f"--- {f['test']} ({f['where']})\n{f['output']}" for f in failed)


def test_every_docstring_example_runs(tmp_path):
    result = run_examples("shardwise", tmp_path, str(ROOT))
    files = [p for p in (ROOT / "shardwise").rglob("*.py") if p.name != "__main__.py"]
    assert len(result["modules"]) == len(files), "a module under shardwise/ was not found"
    assert not result["failed"], (f"{len(result['failed'])} docstrings with failing examples:\n"
                                  + describe(result["failed"]))
    print(f"{result['run']} examples run, {result['skipped']} skipped (+SKIP)")
    assert result["run"] >= 500, result["run"]   # the examples are found, not silently dropped (604 today)


_CANARY = '''"""A module whose examples: one passes, one fails, one is skipped.

>>> 1 + 1
2
>>> sorted({3, 1})
[3, 1]
>>> undefined_name   # doctest: +SKIP
"""
'''


def test_a_broken_example_is_reported_with_module_and_line(tmp_path):
    pkg = tmp_path / "src" / "canary"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Empty."""\n')
    (pkg / "mod.py").write_text(_CANARY)
    (pkg / "bad.py").write_text('"""Unparseable: a comment that reads as an option.\n\n'
                                '>>> 1   # doctest: (collective: 2)\n1\n"""\n')
    result = run_examples("canary", tmp_path, str(tmp_path / "src"))
    assert (result["run"], result["skipped"]) == (2, 1), result
    by_test = {f["test"]: f for f in result["failed"]}
    assert set(by_test) == {"canary.mod", "canary.bad"}, result["failed"]
    assert "mod.py\", line 5, in canary.mod" in by_test["canary.mod"]["output"]
    assert "Expected:\n    [3, 1]\nGot:\n    [1, 3]" in by_test["canary.mod"]["output"]
    assert "invalid option" in by_test["canary.bad"]["output"]
