"""``make bench`` (``python -m mongo_cdc_dev.bench``): mongo-cdc's landing speed and memory next to
baselines and peers measured in the same run. ``run`` orchestrates, ``worker`` measures one path in
a process of its own, ``peers`` runs dlt in a venv of its own, ``table`` prints the result."""
