"""Layer 7, the top: the benchmark suite (``python -m labutils.bench NAME``), one module per
benchmark with ``run(quick) -> list[Row]``, listed by the course map; and the GPU check."""
