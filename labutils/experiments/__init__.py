"""Layer 5: what a lab runs and measures, built from the layers below (DDP performance,
communication overhead, emulated DDP, ZeRO training, the all-reduce fit)."""
