"""Layer 2: pure formulas and models (alpha-beta collectives, step times, the planner and the
published runs it is tested on). numpy and the standard library; no torch.distributed."""
