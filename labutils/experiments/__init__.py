"""Layer 5: what a lab runs and measures, built from the layers below: DDP versions against one
process (ddp_equivalence), DDP performance, communication overhead, emulated DDP, the all-reduce
fit, 04b's resumable training, the pipeline bubble, tensor parallelism checked (tp_equivalence)
and ZeRO training."""
