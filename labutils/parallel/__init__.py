"""Layer 4: the algorithms taught, headless: collectives, DDP, pipeline, tensor and sharded
parallelism, checkpoints, emulated links. No plots, checkers, benchmarks or experiment runners."""
