"""A fleet of GPU kinds on Ray: the runs of ``autotune serve --ray ADDRESS`` execute on a Ray cluster.

- ``cluster.py``: joining the cluster (in the background: the service serves while it is
  unreachable) and what it holds: its nodes, the GPU kind of each, free GPUs per kind.
- ``task.py``: the Ray tasks, one per cell: ``measure_cell`` (``num_gpus=1``, on a node of the
  run's kind) and ``estimate_cell`` (one CPU anywhere).
- ``runner.py``: ``RayRunner``, the runner behind the same interface as the local one
  (api/runs/runner.py); SQLite stays the source of truth, Ray only executes.
- ``launch.py``: "all kinds in the fleet", one run per GPU kind (POST /v1/fleet/tables and the launch
  form), from the kinds the runner describes.
- ``step.py``: what runs on several kinds are compared by (the dashboard's fleet view, api/views/fleet.py).

Ray is optional (the ``[fleet]`` extra): only cluster.py and task.py import it, and nothing imports
them unless a fleet is configured; launch.py and step.py serve every server.
"""

INSTALL_HINT = "pip install 'autotune-batch[fleet]'"
