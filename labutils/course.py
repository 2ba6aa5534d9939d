"""The course map: the one registry of the labs.

Each row says which notebook a chapter of the article becomes, which labutils modules it uses,
which exercise checkers it has and which benchmarks measure it. It drives:

* the face: ``lu.<module>`` and ``lu.check_<name>`` (``labutils/__init__.py``);
* the forkserver's preload (modules of the lower layers that ranks import);
* the benchmark list (``python -m labutils.bench``);
* the README's table of labs (``python -m labutils.course``) and the map in ``01_introduction``
  (``show_map``).

Module short names are file names; ``MODULES`` finds them in the layer folders (bench aside)
without importing anything, and a test keeps every name unique.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from labutils.core import i18n, tables
from labutils.core.env import ROOT

PACKAGE = os.path.dirname(os.path.abspath(__file__))

# bottom to top; each layer imports only from the layers before it (import-linter checks this)
LAYERS = ("core", "cost", "data", "parallel", "experiments", "exercises", "viz", "bench")
# the layers whose modules run inside ranks, imported once by the forkserver
RANK_LAYERS = ("core", "data", "parallel", "experiments")


def _layer_modules():
    found = {}
    for layer in LAYERS[:-1]:   # not bench: its modules are benchmarks, named after what they measure
        for name in sorted(os.listdir(os.path.join(PACKAGE, layer))):
            if name.endswith(".py") and not name.startswith("_"):
                found.setdefault(name[:-3], []).append(f"labutils.{layer}.{name[:-3]}")
    return found


_FOUND = _layer_modules()
# short name -> module; names used in more than one layer (a test fails on them) are left out
MODULES = {name: paths[0] for name, paths in _FOUND.items()
           if len(paths) == 1 and not name.startswith("lab") and name not in ("base", "suite")}


@dataclass(frozen=True)
class Lab:
    chapter: str                 # the article's chapter (the Chinese map: the article's heading)
    notebook: str                # file name without .ipynb
    modules: tuple               # labutils modules behind it (short names)
    shows: str                   # what the learner does and sees
    minutes: str                 # top to bottom on a 2-core laptop
    checkers: tuple = ()         # exercise names: lu.check_<name>, in exercises/lab<code>.py
    benchmarks: tuple = ()       # modules of labutils/bench/
    device: str = "CPU (GPU optional)"

    @property
    def code(self):              # "04a" for 04a_ddp_from_scratch
        return self.notebook.split("_", 1)[0]

    @property
    def exercises(self):
        return f"labutils.exercises.lab{self.code}"

    @property
    def path(self):
        return os.path.join(ROOT, "notebooks", self.notebook + ".ipynb")

    @property
    def exists(self):
        return os.path.exists(self.path)


LABS = (
    Lab("1 Introduction 引言", "01_introduction", ("launcher", "env", "timing"),
        "this machine; a first 2-rank all-reduce from a notebook cell; what a failing or "
        "deadlocked rank looks like; training FLOPs (counted) and time vs data and model "
        "size; a data split timed inside the ranks, launch cost apart",
        "1", checkers=("max_allreduce", "mlp_flops_per_sample"), benchmarks=("launch",)),
    Lab("2 PyTorch essentials PyTorch简介", "02_pytorch_essentials",
        ("datasets", "models", "train", "run"),
        "dynamic graphs, autograd vs finite differences, grad_fn and saved tensors, a training "
        "loop on real digits, "
        "saving weights; the torch.distributed map with each launcher run once", "1.5",
        checkers=("square", "count_graph_nodes")),
    Lab("3.1 Concepts 基本概念 (1): collectives and the ring", "03a1_collectives_and_ring",
        ("collectives", "collective_demo", "collective_runs", "figures"),
        "data vs model parallelism; every collective on real ranks, drawn; ring and recursive-"
        "doubling all-reduce from send/recv vs dist.all_reduce; bytes per link and message steps "
        "counted (ring, recursive doubling, via a root)", "1",
        checkers=("ring_all_reduce",), benchmarks=("collectives",)),
    Lab("3.1 Concepts 基本概念 (2): what a collective costs", "03a2_collective_cost",
        ("collectives", "collective_runs", "costmodel", "emulation", "figures"),
        "latency and bandwidth fitted (alpha-beta) with residuals; ring, recursive doubling and "
        "halving-doubling on 4 ranks across sizes: where the best algorithm changes", "1",
        checkers=("crossover",), benchmarks=("costmodel",)),
    Lab("3.1 Concepts 基本概念 (3): synchronous vs asynchronous SGD", "03b_sync_async_sgd",
        ("async_sgd", "sgd_runs", "flat_mlp", "staleness"),
        "sync SGD, a parameter server and Hogwild at equal work; a straggler; what staleness "
        "does to convergence, a parameter server replayed from its trace", "1.5",
        checkers=("stale_update",)),
    Lab("3.2 Scenarios 应用场景", "03c_scenarios", ("workloads", "datasets", "train"),
        "image, language and video workloads on 1 and 2 ranks; compute-to-communication "
        "ratio and what it does and does not explain", "1.5", checkers=("shard_batch",)),
    Lab("3.3 Challenges 挑战 (1): communication overhead", "03d_communication_challenges",
        ("comm_overhead", "async_sgd", "sgd_runs"),
        "small messages vs buckets; compression, and when it pays", "1.5",
        checkers=("fp16_mean",)),
    Lab("3.3 Challenges 挑战 (2): data inconsistency", "03e1_data_inconsistency",
        ("data_consistency", "sync_batchnorm", "async_sgd", "collectives"),
        "set_epoch and its effect on training, BatchNorm per rank vs synchronised, "
        "nondeterminism", "1",
        checkers=("sync_batch_stats",)),
    Lab("3.3 Challenges 挑战 (3): hardware constraints", "03e2_hardware_constraints",
        ("memory", "oversubscription"),
        "memory of weights, gradients, optimiser state, activations, measured under PyTorch's "
        "default and with kept gradients; oversubscription", "1",
        checkers=("model_states",)),
    Lab("4 DDP from scratch 分布式训练实现", "04a_ddp_from_scratch",
        ("ddp", "ddp_equivalence", "ddp_performance", "comm_spans", "commcount"),
        "naive gradient all-reduce, hooks, buckets with overlap; each checked equal to one "
        "process and to PyTorch's DDP", "1.5",
        checkers=("average_gradients", "sync_gradients", "torch_buckets")),
    Lab("4 DDP in practice", "04b_ddp_in_practice",
        ("ddp", "ddp_hooks", "checkpoint", "resumable_training", "run"),
        "DistributedSampler, no_sync accumulation, compression hooks, exact resume from a "
        "checkpoint, torchrun with a killed worker", "1.5",
        checkers=("no_sync_accumulation",)),
    Lab("4 Performance analysis 性能分析 (1): scaling and overlap", "04c1_scaling_and_overlap",
        ("ddp_performance", "comm_spans", "emulated_overlap", "costmodel", "step_time", "plots",
         "timeline_plot"),
        "strong and weak scaling with error bars, per-rank timelines, what overlap buys "
        "(buckets launched after backward, paired), one thread's exposed communication, "
        "three cost models vs the bucket sweep", "1",
        checkers=("exposed_comm",), benchmarks=("ddp",)),
    Lab("4 Performance analysis 性能分析 (2): links, shared memory and the cost model",
        "04c2_links_and_cost_model",
        ("ddp_performance", "costmodel", "emulation", "shm_allreduce", "emulated_ddp", "plots"),
        "the machine's limits (memory copy, gloo, shared memory), 2 ranks vs one process, "
        "emulated links that bind, the cost model against real runs", "1",
        checkers=("bus_bandwidth",), benchmarks=("emulated_ddp",)),
    Lab("5 Model parallelism principles 模型并行化原理", "05_model_parallel_principles",
        ("model_parallel", "model_parallel_runs", "stage_observers", "stage_memory", "memory",
         "microbatch", "microbatch_idle", "timeline", "timeline_plot"),
        "the memory wall, per-rank peaks measured vs the formula; a naive layer split with "
        "send/recv checked equal to one process; its idle timeline; micro-batches with send vs "
        "isend measured against (p-1)/(m+p-1); where each form of model parallelism is used",
        "1.5",
        checkers=("naive_backward", "min_microbatches")),
    Lab("6 Pipeline parallelism 模型并行化实践 (1): GPipe and 1F1B from scratch",
        "06a1_pipeline_from_scratch",
        ("pipeline", "pipeline_runs", "stage_observers", "pipeline_bubble", "emulated_stages",
         "timeline", "timeline_plot"),
        "GPipe and 1F1B from send/recv, checked equal; bubbles counted and measured (emulated "
        "compute), measured/formula per round with its interval, gaps per operation; stage "
        "balance", "1.5",
        checkers=("one_f_one_b_schedule",), benchmarks=("pipeline",)),
    Lab("6 Pipeline parallelism 模型并行化实践 (2): schedules", "06a2_pipeline_schedules",
        ("torch_pipeline", "pipeline_runs", "stage_observers", "pipeline_bubble",
         "emulated_stages", "commcount"),
        "activation bytes of GPipe vs 1F1B; torch.distributed.pipelining (GPipe, 1F1B, "
        "interleaved 1F1B, zero bubble, ZBV) checked equal; bubbles, activations and messages "
        "counted; per-action waits inside PyTorch's schedules measured and replayed", "1"),
    Lab("6 Tensor parallelism 实践", "06b_tensor_parallel",
        ("tensor_parallel", "tp_equivalence", "tp_timing"),
        "Megatron column/row-parallel layers, parallel MLP, attention and layer, checked equal; "
        "bytes and all-reduces per layer; a layer timed on 1 rank vs TP vs DP, with timelines; "
        "torch.distributed.tensor.parallel", "1.5",
        checkers=("f_and_g", "crossover_tokens"), benchmarks=("tensor_parallel",)),
    Lab("6 Sharding and memory 性能优化 (1): ZeRO from scratch", "06c1_zero_stages",
        ("sharding", "zero_optimizer", "zero_training", "memory", "commcount"),
        "ZeRO 1/2/3 from scratch on reduce-scatter and all-gather, checked equal to data "
        "parallelism (padding included); model state held = the paper's formula byte for "
        "byte; measured peak minus activations within 5% of it per stage; bytes per step "
        "counted (2Ψ, 2Ψ, 2Ψ, 3Ψ)", "1",
        checkers=("zero1_step",), benchmarks=("zero",)),
    Lab("6 Sharding and memory 性能优化 (2): FSDP2, mixed precision, checkpointing",
        "06c2_fsdp_and_memory",
        ("sharding", "zero3", "zero_training", "zero_components", "mixed_precision", "memory"),
        "FSDP2 checked equal, its measured/formula memory ratio; ZeRO-3 around a tied-head GPT "
        "equal to fully_shard; mixed precision's bytes (16Ψ either way until ZeRO shards the "
        "optimiser), bf16 all-gathers counted at half; checkpointing and bf16 timed; a "
        "walk-through changing one thing per row", "1",
        checkers=(), benchmarks=()),
    Lab("6 Sequence parallelism 实践", "06d1_sequence_parallelism",
        ("sequence_parallel", "sp_equivalence", "sp_memory", "long_context"),
        "Megatron sequence parallelism on TP, checked equal (outputs and every gradient) on 2, 3 "
        "and 4 ranks; payloads counted at the dispatcher (TP's bytes in twice the calls, ring "
        "model); activation memory counted against the formula, with Megatron's re-gather; a step "
        "timed against TP and in Megatron's (s, b, h) layout, in paired rounds", "1.5"),
    Lab("6 Context parallelism 实践", "06d2_context_parallelism",
        ("online_softmax", "ring_attention", "ring_timing", "ring_trace", "emulation", "ulysses",
         "ulysses_equivalence", "long_context"),
        "ring attention with the online softmax and Ulysses all-to-all attention, checked equal "
        "(outputs and every gradient) on 2, 3 and 4 ranks; sends counted; zig-zag balance "
        "counted; overlapped against serial hops timed on 2 ranks (real and emulated link); "
        "ring against Ulysses bytes for MHA and GQA", "1.5",
        checkers=("merge_attention_blocks",)),
    Lab("6 Expert parallelism 实践", "06d3_expert_parallelism",
        ("moe_router", "moe", "moe_dispatch", "moe_balance", "commcount", "long_context"),
        "a mixture-of-experts layer routed as GShard does (first choices before second choices; "
        "what token-major order would drop, counted), the load-balancing loss against its "
        "balanced value 1 and a router collapsing without it, expert parallelism with two "
        "all-to-alls checked equal to one process (outputs and every gradient) on 2, 3 and 4 "
        "ranks, bytes counted at the dispatcher", "0.5",
        checkers=("keep_within_capacity", "dispatch_indices")),
    Lab("6 Composed parallelism 性能优化: data x tensor x pipeline", "06e_composed_parallelism",
        ("parallel_dims", "composed", "torch_composed", "composed_runs", "mesh_plot",
         "commcount", "timeline", "timeline_plot"),
        "ParallelDims: a rank's coordinates and groups on a (pp, dp, cp, tp) mesh, checked "
        "against DeviceMesh; a small GPT trained on 8 ranks as dp=2 x tp=2 x pp=2 from Megatron "
        "layers, 1F1B and a gradient all-reduce, and as dp=2 x cp=2 x tp=2 with ring attention, "
        "each checked equal to one process (float64); calls and bytes per mesh dimension "
        "counted equal to the formula; where each dimension's "
        "communication falls in a step; fully_shard + parallelize_module + pipelining on the "
        "same mesh checked equal", "0.5",
        checkers=("rank_coords",)),
    Lab("Conclusion and outlook 结论与展望", "07_conclusion_outlook",
        ("costmodel", "allreduce_fit", "emulated_ddp", "planspec", "plan_memory", "planner",
         "capacity", "long_context", "published"),
        "the cost model's form fitted here, tested on held-out all-reduce repeats and real DDP "
        "steps (an emulated link only checks the emulator); a planner whose constants come from "
        "datasheets and named published rows, its errors on 2022-2024 runs it was not fitted to "
        "printed per source against a constant baseline, extrapolated term by term to 4,096 "
        "GPUs", "1.5",
        checkers=("dp_bytes_per_gpu", "fewest_micro_batches")),
)


def checker_module(name):
    """The exercises module that defines ``check_<name>`` (``name`` without ``check_``)."""
    for lab in LABS:
        if name in lab.checkers:
            return lab.exercises
    return None


def checkers():
    """Every exercise name, in course order."""
    return tuple(name for lab in LABS for name in lab.checkers)


def benchmarks():
    """Every benchmark (a module of labutils/bench/), in course order."""
    return tuple(name for lab in LABS for name in lab.benchmarks)


def rank_modules():
    """Modules the forkserver imports once, so that each rank's fork starts warm."""
    return tuple(path for path in MODULES.values() if path.split(".")[1] in RANK_LAYERS)


# The map's English text; its Chinese is in labutils/locale/zh.po under this msgctxt
# (tools/zh_messages.py puts every header word, chapter, "shows" and "device" there). In
# Chinese a chapter is the article's own heading (its section 1.4 names chapters 4-7), with
# the lab's part after a colon.
COURSE = "course map"
HEADER = ("article chapter", "notebook", "labutils", "what it shows", "minutes on a laptop",
          "CPU/GPU")
COMING = "(coming)"


STUDENT_COLUMNS = ("article chapter", "notebook", "what it shows", "minutes on a laptop")


def markdown_table(link_prefix="notebooks/", language="en", columns=HEADER):
    """The labs as a Markdown table, in English or in Chinese ("zh", the map of the Chinese
    edition); labs not written yet are marked as coming. ``columns``: which of ``HEADER``'s
    (the README has them all; a notebook shows ``STUDENT_COLUMNS``, narrow enough for a
    1,024-pixel projector)."""
    if language not in i18n.LANGUAGES:
        raise ValueError(f"no course map in {language!r}; the choices are "
                         f"{', '.join(repr(x) for x in i18n.LANGUAGES)}")

    def say(text):
        return i18n.translate(text, language, context=COURSE)
    rows = []
    for lab in LABS:
        name = (f"[{lab.notebook}]({link_prefix}{lab.notebook}.ipynb)" if lab.exists
                else f"{lab.notebook} {say(COMING)}")
        row = dict(zip(HEADER, (say(lab.chapter), name, ", ".join(f"`{m}`" for m in lab.modules),
                                say(lab.shows), lab.minutes, say(lab.device))))
        rows.append(tuple(row[c] for c in columns))
    return tables.markdown_table(rows, tuple(say(h) for h in columns))


def show_map():
    """Display the course map in a notebook (links relative to the notebook's folder), in the
    language set by ``lu.set_language``."""
    from IPython.display import Markdown, display
    display(Markdown(markdown_table(link_prefix="", language=i18n.language(),
                                    columns=STUDENT_COLUMNS)))


README_START, README_END = "<!-- labs:start -->", "<!-- labs:end -->"


def readme_section(readme_text):
    """The part of the README between the labs markers."""
    start = readme_text.index(README_START) + len(README_START)
    return readme_text[start:readme_text.index(README_END)].strip()


def write_readme(path=os.path.join(ROOT, "README.md")):
    """Refresh the README's table of labs from LABS: ``python -m labutils.course``."""
    with open(path) as f:
        text = f.read()
    start = text.index(README_START) + len(README_START)
    text = text[:start] + "\n" + markdown_table() + "\n" + text[text.index(README_END):]
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    write_readme()
