"""A fleet of GPU kinds on Ray: the runs of ``autotune serve --ray ADDRESS`` execute on a Ray cluster.

- ``cluster.py``: joining the cluster (in the background: the service serves while it is
  unreachable) and what it holds: its nodes, the GPU kind of each, free GPUs per kind.
- ``task.py``: the Ray tasks, one per cell: ``measure_cell`` (``num_gpus=1``, on a node of the
  run's kind) and ``estimate_cell`` (one CPU anywhere).
- ``api/runs/ray_runner.py``: ``RayRunner``, the runner behind the same interface as the local
  one; SQLite stays the source of truth, Ray only executes.

Ray is optional (the ``[fleet]`` extra): nothing here is imported unless a fleet is configured.
"""

INSTALL_HINT = "pip install 'autotune-batch[fleet]'"
