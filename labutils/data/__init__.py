"""Layer 3: data sets, models, workloads and the single-process reference training loop."""
