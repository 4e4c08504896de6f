"""Starting the job's processes: checks made before any worker starts (`prelaunch.py`), the machine's
cores and devices (`host.py`) and torch's elastic launcher (`launch.py`)."""
