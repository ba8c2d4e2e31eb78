"""What the admin reads: queue-time ratio, JCT, waits, estimator bias, decisions; rendering
(text, CSV/JSON, plots, Prometheus) and ``explain``. Reads the history through the store.

Imports the core and the store (and the controller's profile reading for ``explain``);
never the CLI or the simulator.
"""
