"""The Chinese (zh-CN) catalog of ``core.i18n``: English template -> Chinese template.

A Python dict rather than a JSON file: it ships inside the package with no package-data
setting, loads in the forkserver with the rest of ``core`` (no file to open in every rank), and
takes comments. ``MESSAGES``' keys are the literals passed to ``tr`` in labutils, character for
character; each Chinese template uses the same ``{placeholders}`` (tests/test_i18n.py checks
both ways). ``COURSE_*`` at the end hold the course map of the Chinese edition
(``course.show_map``), keyed by the English text of ``course.LABS`` (tests/test_course.py).
Terms follow the course's glossary; numbers, code and API names stay as they are.
"""

MESSAGES = {
    # ---- core.env: the machine report (first cell of 01) --------------------------------
    "none": "无",
    "yes": "可用",
    "no": "不可用",
    "one rank per core or GPU; more ranks share cores":
        "每个核心或 GPU 一个 rank；更多 rank 将共享核心",
    "one rank per core; more ranks share cores": "每个核心一个 rank；更多 rank 将共享核心",
    "cores (usable): {cores}": "可用核心数：{cores}",
    "memory: {gb:.1f} GB": "内存：{gb:.1f} GB",
    "GPUs: {gpus}": "GPU：{gpus}",
    "backends: {backends}": "后端（backend）：{backends}",
    "recommended world sizes: {sizes} ({per})": "推荐的进程总数（world size）：{sizes}（{per}）",

    # ---- core.launcher ----------------------------------------------------------------
    "{world_size} ranks on {cores} cores: ranks will share cores (oversubscription), so "
    "timings will be slower than with {cores} ranks":
        "{world_size} 个 rank 运行在 {cores} 个核心上：rank 将共享核心（超额订阅，"
        "oversubscription），因此计时会比 {cores} 个 rank 时更慢",
    "stopped: every rank was ended": "已停止：所有 rank 均已结束",
    "launch timed out after {timeout:g} s; still running: {stuck}":
        "启动在 {timeout:g} 秒后超时；仍在运行：{stuck}",

    # ---- core.stacks: why a rank ended or where it hangs (composed in the launching process)
    "rank {rank}: process ended without an exit status": "rank {rank}：进程结束时没有退出状态",
    "rank {rank}: process killed by signal {name}": "rank {rank}：进程被信号 {name} 终止",
    "rank {rank}: process exited with code {code} without returning a result":
        "rank {rank}：进程以退出码 {code} 退出，没有返回结果",
    "no Python stack could be read": "无法读取 Python 调用栈",
    "waiting in dist.{fn}": "在 dist.{fn} 中等待",
    "running": "正在运行",
    "in {fn}": "位于 {fn}",
    "{what}, line {line} of {fn}": "{what}（{fn} 的第 {line} 行）",

    # ---- core.timing.versus ------------------------------------------------------------
    "faster than": "快于",
    "slower than": "慢于",
    "not measurably different from": "在测量上无法区别于",

    # ---- exercises.base: the pieces of every checker's message ---------------------------
    "fill in the lines marked # FILL ME IN": "请补全标有 # FILL ME IN 的代码行",
    "[to do] {name}: not implemented yet; {todo}": "[待完成] {name}：尚未实现；{todo}",
    "expected {e}, got {g}": "应为 {e}，实际为 {g}",
    "element {index}: {diff}": "元素 {index}：{diff}",
    "a tensor of shape {shape}": "形状为 {shape} 的张量",
    "a {type} of {n} items": "含 {n} 项的 {type}",
    "a {type} of 1 item": "含 1 项的 {type}",
    "shape: expected {e}, got {g}": "形状：应为 {e}，实际为 {g}",
    "dtype: expected {e}, got {g}": "dtype：应为 {e}，实际为 {g}",
    "value: {diff}": "数值：{diff}",
    "rank {rank} raised {error}: {message}": "rank {rank} 抛出 {error}：{message}",
    "rank {rank} raised {error}": "rank {rank} 抛出 {error}",
    "[wrong] {name}: case {number} of {total} ({case})":
        "[错误] {name}：共 {total} 个用例，第 {number} 个未通过（{case}）",
    "1 case passed": "1 个用例通过",
    "{total} cases passed": "{total} 个用例全部通过",
    "[ok] {name}: {passed} (world size {sizes})": "[通过] {name}：{passed}（进程总数 {sizes}）",
    "[ok] {name}: {passed} (world sizes {sizes})": "[通过] {name}：{passed}（进程总数 {sizes}）",
    "missing key {key!r}": "缺少键 {key!r}",
    "unexpected key {key!r}": "多出了键 {key!r}",
    "key {key!r}: {diff}": "键 {key!r}：{diff}",
    "length: expected {e} items, got {g}": "长度：应为 {e} 项，实际为 {g}",
    "item {i}: {diff}": "第 {i} 项：{diff}",
    "expected a number ({e}), got {g}": "应为一个数（{e}），实际为 {g}",
    "check_{name} needs your function itself, e.g. lu.check_{name}(my_{name}) (no parentheses "
    "after it); got {type}":
        "check_{name} 需要传入函数本身，例如 lu.check_{name}(my_{name})（函数名后不加括号）；"
        "实际传入的是 {type}",
    "{where}: did not finish in {timeout:g} s (deadlock?): {stuck}":
        "{where}：{timeout:g} 秒内未完成（死锁？）：{stuck}",
    "{where}: rank {rank}, {diff}": "{where}：rank {rank}，{diff}",
    "{where}: raised {error}: {message}": "{where}：抛出 {error}：{message}",

    # ---- lab 01 ------------------------------------------------------------------------
    "the elementwise max over all ranks": "所有 rank 的逐元素最大值",
    "{values}: not the max": "{values}：不是最大值",
    "returns": "返回值",
    "holds": "内容",
    "a tensor": "一个张量",
    "{type}: return the tensor": "{type}：请返回该张量",
    "the sum: all_reduce sums unless op=ReduceOp.MAX":
        "这是总和：除非 op=ReduceOp.MAX，all_reduce 默认求和",
    "its own start: no collective changed it": "仍是它的初始值：没有任何集合通信改变它",
    "the min over all ranks (ReduceOp.MIN)": "所有 rank 的最小值（ReduceOp.MIN）",
    "[ok] {name}: {n} cases passed, equal to FlopCounterMode's count":
        "[通过] {name}：{n} 个用例全部通过，与 FlopCounterMode 的计数相等",
    "that is the forward pass alone; backward does two more matmuls per layer (weight "
    "gradient and input gradient)":
        "这只是前向传播；反向传播每层还要做两次矩阵乘法（权重梯度和输入梯度）",
    "forward and the weight gradients; every layer but the first also computes the gradient "
    "of its input":
        "这是前向传播加权重梯度；除第一层外，每层还要计算其输入的梯度",
    "6 x weights counts the first layer's input gradient too; the data does not require grad, "
    "so autograd skips that matmul":
        "6 × 权重数把第一层的输入梯度也算进去了；数据不需要梯度，自动微分（autograd）会跳过"
        "这次矩阵乘法",
    "6 x parameters counts biases as matmul work (they are additions, not counted) and the "
    "first layer's input gradient, which autograd skips":
        "6 × 参数数把偏置当成了矩阵乘法的工作量（它们是加法，不计入），还算进了第一层的输入"
        "梯度，而自动微分会跳过它",
    "that is about the forward pass alone, biases included; backward does more, and bias adds "
    "are not counted":
        "这大约只是前向传播（含偏置）；反向传播做得更多，且偏置加法不计入",
    "check_mlp_flops_per_sample needs your function itself, e.g. "
    "lu.check_mlp_flops_per_sample(my_flops)":
        "check_mlp_flops_per_sample 需要传入函数本身，例如 "
        "lu.check_mlp_flops_per_sample(my_flops)",
    "{where}: expected {expected} (PyTorch's count), got {got:g}: {why}":
        "{where}：应为 {expected}（PyTorch 的计数），实际为 {got:g}：{why}",
    "{where}: expected a number of FLOPs, got {type} {got!r}":
        "{where}：应为一个 FLOPs 数，实际为 {type} {got!r}",
    "off by a factor {factor:.3g}": "相差 {factor:.3g} 倍",

    # ---- lab 02 ------------------------------------------------------------------------
    "x * grad_output is half of it: d(x**2)/dx = 2x": "x * grad_output 只是一半：d(x**2)/dx = 2x",
    "2x alone ignores grad_output: the chain rule multiplies by it":
        "只返回 2x，就忽略了 grad_output：链式法则要乘上它",
    "x alone: the derivative of x**2 is 2x, times grad_output":
        "只返回了 x：x**2 的导数是 2x，再乘以 grad_output",
    "grad_output alone: multiply by the local derivative 2x":
        "只返回了 grad_output：还要乘以局部导数 2x",
    "2 * grad_output: the local derivative is 2x, not 2": "2 * grad_output：局部导数是 2x，而不是 2",
    "not 2 * x * grad_output": "不等于 2 * x * grad_output",
    "check_square needs your class itself, a subclass of torch.autograd.Function, e.g. "
    "lu.check_square(Square)":
        "check_square 需要传入类本身（torch.autograd.Function 的子类），例如 "
        "lu.check_square(Square)",
    "x of shape {shape}": "x 的形状为 {shape}",
    "{where}: forward should return x ** 2": "{where}：forward 应返回 x ** 2",
    "{where}: backward should return one gradient shaped like x":
        "{where}：backward 应返回一个与 x 形状相同的梯度",
    "{where}: wrong gradient: {why}": "{where}：梯度错误：{why}",
    "[wrong] {name}: gradcheck disagrees with your backward":
        "[错误] {name}：gradcheck 与你的 backward 不一致",
    "[ok] {name}: {n} cases and gradcheck passed": "[通过] {name}：{n} 个用例和 gradcheck 全部通过",
    "tanh(a * b) used twice": "tanh(a * b) 被使用两次",
    "a and b each used twice": "a 和 b 各被使用两次",
    "a chain that forks and joins": "先分叉再汇合的链",
    "that counts a node once per path to it; a node reached by two paths is one node (keep a "
    "set of the nodes seen)":
        "这样每条到达节点的路径都会把它计数一次；经两条路径到达的节点仍是一个节点（用集合记录"
        "已访问的节点）",
    "that follows only the first edge of each node; follow every entry of next_functions":
        "这样只沿每个节点的第一条边走；要遍历 next_functions 的每一项",
    "the AccumulateGrad nodes (one per leaf that requires grad) are nodes too":
        "AccumulateGrad 节点（每个需要梯度的叶子一个）也是节点",
    "check_count_graph_nodes needs your function itself, e.g. "
    "lu.check_count_graph_nodes(count_graph_nodes)":
        "check_count_graph_nodes 需要传入函数本身，例如 "
        "lu.check_count_graph_nodes(count_graph_nodes)",
    "[ok] {name}: {n} graphs passed": "[通过] {name}：{n} 个计算图全部通过",

    # ---- lab 03a -----------------------------------------------------------------------
    "every rank's tensor is unchanged: write the sum into `tensor` itself, in place":
        "每个 rank 的张量都没有变化：请把总和原地写入 `tensor` 本身",
    "every rank holds the mean: an all-reduce sums, do not divide by the world size":
        "每个 rank 得到的是平均值：全归约（All-Reduce）求的是和，不要除以进程总数",
    "rank {rank} holds the full sum in chunk(s) {right} only: that is where a reduce-scatter "
    "ends; p - 1 all-gather steps must then pass each finished chunk around the ring":
        "rank {rank} 只在第 {right} 块中得到完整的和：这正是归约散射（Reduce-Scatter）结束时"
        "的状态；之后还需 p - 1 步全收集（All-Gather），把每个完成的块沿环传递一圈",

    # ---- lab 03b -----------------------------------------------------------------------
    "the gradient is taken at the newest weights: that is synchronous SGD, staleness 0":
        "梯度是在最新权重上计算的：这是同步随机梯度下降（SGD），陈旧度为 0",
    "the stale gradient is applied to the stale weights; the server applies it to its newest "
    "weights, the ones other workers have updated since":
        "陈旧的梯度被应用到了陈旧的权重上；参数服务器把它应用到自己最新的权重上，即其他"
        "工作进程此后已更新过的权重",
    "off by one: history[-staleness] is w_(t - staleness + 1); the weights staleness updates "
    "before the newest are history[-1 - staleness]":
        "差了一位：history[-staleness] 是 w_(t - staleness + 1)；比最新权重早 staleness 次"
        "更新的权重是 history[-1 - staleness]",
    "while fewer than staleness updates exist a negative index wraps around to recent "
    "weights; the gradient must come from w_0 then":
        "当更新次数少于 staleness 时，负索引会绕回到较新的权重；此时梯度必须取自 w_0",

    # ---- lab 03c -----------------------------------------------------------------------
    "each sample on exactly one rank": "每个样本恰好在一个 rank 上",
    "samples": "样本",
    "gradient": "梯度",
    "sample {i} on no rank": "样本 {i} 不在任何 rank 上",
    "sample {i} on two ranks": "样本 {i} 在两个 rank 上",

    # ---- lab 03d -----------------------------------------------------------------------
    "all-reduce calls": "全归约调用次数",
    "dtype sent": "发送的 dtype",
    "in place": "原地",
    "overflow": "溢出",
    "the tensors hold the result": "张量中是结果",
    "mean": "平均值",
    "unchanged: copy_ the mean into them": "未改变：请用 copy_ 把平均值写入它们",
    "inf: fp16 sum overflowed, divide by world_size before": "inf：fp16 求和溢出，请先除以 world_size",
    "nothing sent": "什么也没发送",
    "several: {dtypes}": "多种：{dtypes}",

    # ---- lab 03e -----------------------------------------------------------------------
    "of every rank's samples": "基于所有 rank 的样本",
    "biased, of every rank's samples": "有偏，基于所有 rank 的样本",
    "variance": "方差",
    "values": "数值",
    "this rank's only: all-reduce the sums": "只用了本 rank 的：请对和做全归约",
    "mean of ranks' means: wrong for unequal batch sizes": "各 rank 平均值的平均：批次大小不等时错误",
    "this rank's only: all-reduce x*x sums": "只用了本 rank 的：请对 x*x 的和做全归约",
    "unbiased (n-1): BatchNorm divides by n": "无偏（n-1）：批归一化（BatchNorm）除以 n",
    "mean of ranks' variances: use E[x^2] - mean^2": "各 rank 方差的平均：请用 E[x^2] - mean^2",

    # ---- lab 04a / 04b -----------------------------------------------------------------
    "weights": "权重",
    "all-reduce calls: at most 2 per step (usage flags, then one flat buffer)":
        "全归约调用次数：每步最多 2 次（先是使用标志，再是一个扁平缓冲区）",
    "gradients": "梯度",
    "backward passes that all-reduced": "做了全归约的反向传播次数",

    # ---- lab 05 ------------------------------------------------------------------------
    "[ok] {name}: {total} cases passed": "[通过] {name}：{total} 个用例全部通过",
    "at that m the idle share equals the target; below means strictly less (<, not <=)":
        "在这个 m 下空闲占比恰好等于目标；低于意味着严格小于（<，而不是 <=）",
    "that is the m for p/(m+p); the idle share of p stages is (p-1)/(m+p-1): p-1 slots of "
    "fill and drain, not p":
        "这是 p/(m+p) 对应的 m；p 个阶段（stage）的空闲占比是 (p-1)/(m+p-1)：填充和排空共 "
        "p-1 个时隙，而不是 p 个",
    "that makes (p-1)/m small enough; the idle share divides by the whole step, m+p-1 slots":
        "这让 (p-1)/m 足够小；空闲占比要除以整个步，即 m+p-1 个时隙",
    "check_min_microbatches needs your function itself, e.g. "
    "lu.check_min_microbatches(my_min_microbatches)":
        "check_min_microbatches 需要传入函数本身，例如 "
        "lu.check_min_microbatches(my_min_microbatches)",
    "{where}: got {got:.3g}, which looks like an idle share; return the number of "
    "micro-batches m (an int)":
        "{where}：得到 {got:.3g}，看起来像空闲占比；请返回微批次（micro-batch）数 m（一个 int）",
    "{where}: expected an int (a number of micro-batches), got {type} {got!r}":
        "{where}：应为一个 int（微批次数），实际为 {type} {got!r}",
    "m={m} already gives {idle:.3g}: return the smallest m": "m={m} 已得到 {idle:.3g}：请返回最小的 m",
    "with m={m} the idle share is {idle:.3g}, not below {t}":
        "m={m} 时空闲占比为 {idle:.3g}，未低于 {t}",

    # ---- lab 06a -----------------------------------------------------------------------
    "stage {s}: {problem}": "阶段 {s}：{problem}",
    "schedule": "调度",
    "valid": "有效",
    "forwards before the first backward (1F1B: min(p - s, m))":
        "第一次反向传播之前的前向次数（1F1B：min(p - s, m)）",
    "order": "顺序",
    # parallel.pipeline.schedule_problem and experiments.pipeline_bubble.ideal_timeline
    "{op}{i} appears {n} times": "{op}{i} 出现了 {n} 次",
    "B{i} before F{i}": "B{i} 在 F{i} 之前",
    "{n} ops, expected {e}": "共 {n} 个操作，应为 {e} 个",
    "rank {r} at {kind}{i} of stage {s}": "rank {r} 停在阶段 {s} 的 {kind}{i}",
    "deadlock: {stuck} (each waits for another)": "死锁：{stuck}（彼此等待）",
    # parallel.pipeline.validate_config and parallel.microbatch.validate_microbatches
    "unknown schedule {schedule!r}; use one of {names} or a function "
    "(stage, n_stages, n_microbatches) -> ops":
        "未知的调度 {schedule!r}；请使用 {names} 之一，或一个函数 "
        "(stage, n_stages, n_microbatches) -> ops",
    "n_microbatches must be >= 1; got {n}": "n_microbatches 必须 >= 1；实际为 {n}",
    "a batch of {batch_size} samples cannot be split into {m} equal micro-batches: use "
    "n_microbatches in {options} or a batch size divisible by {m}":
        "{batch_size} 个样本的批次无法平均分成 {m} 个微批次：请使用 {options} 中的 "
        "n_microbatches，或使用能被 {m} 整除的批次大小",
    "a batch of {batch_size} samples cannot be split into {m} equal micro-batches: use one "
    "of {options}":
        "{batch_size} 个样本的批次无法平均分成 {m} 个微批次：请使用 {options} 中的一个",

    # ---- lab 06b -----------------------------------------------------------------------
    "f and g swapped: f sums in backward, g in forward": "f 和 g 弄反了：f 在反向时求和，g 在前向时求和",
    "g's forward does not all-reduce the partial outputs": "g 的前向没有对部分输出做全归约",
    "g's forward averages; the partial outputs must be summed": "g 的前向求了平均；部分输出必须求和",
    "g's forward all-reduces twice; once is the sum": "g 的前向做了两次全归约；一次就是总和",
    "g's backward all-reduces; it must be the identity": "g 的反向做了全归约；它必须是恒等映射",
    "f's forward all-reduces; it must be the identity": "f 的前向做了全归约；它必须是恒等映射",
    "f's backward does not all-reduce the input gradient": "f 的反向没有对输入梯度做全归约",
    "f's backward averages; the gradient parts must be summed": "f 的反向求了平均；梯度的各部分必须求和",
    "f's backward all-reduces twice; once is the sum": "f 的反向做了两次全归约；一次就是总和",
    "f and g": "f 和 g",
    "right": "正确",
    "f forward": "f 前向",
    "f backward": "f 反向",
    "g forward": "g 前向",
    "g backward": "g 反向",
    "MLP output": "MLP 输出",
    "MLP input grad": "MLP 输入梯度",
    "fc1.weight grad": "fc1.weight 梯度",
    "fc2.weight grad": "fc2.weight 梯度",
    "check_f_and_g needs two torch.autograd.Function classes, lu.check_f_and_g(MyF, MyG); "
    "{name} is {op!r}":
        "check_f_and_g 需要两个 torch.autograd.Function 类，lu.check_f_and_g(MyF, MyG)；"
        "{name} 是 {op!r}",

    # ---- lab 06d -----------------------------------------------------------------------
    # dispatch_indices (order and send_counts are the answer's names: they stay as code)
    "answer": "答案",
    "{type}, not a pair": "{type}，不是一对值",
    "order, send_counts: 1-D integer tensors or lists":
        "order 和 send_counts 应为一维整数张量或列表",
    "send_counts has length {n} < N: use minlength=N":
        "send_counts 的长度为 {n}，小于 N：请用 minlength=N",
    "one per expert ({num_experts}); count per rank ({world_size})":
        "每个专家一个（{num_experts} 个）；应按 rank 计数（{world_size} 个）",
    "only {tokens} of {slots} slots: flatten the [T, k] choices":
        "{slots} 个槽位只有 {tokens} 个：请把 [T, k] 的选择展平",
    "e % {world_size}: experts are contiguous, owner e // {per_rank}":
        "e % {world_size}：专家是连续分配的，所属 rank 为 e // {per_rank}",
    "must list each of the {slots} slots exactly once": "{slots} 个槽位必须各出现恰好一次",
    "not grouped by destination rank (rank 0 first)": "没有按目标 rank 分组（rank 0 在前）",
    "within a rank, order the slots by expert": "同一 rank 内，请按专家给槽位排序",
    "within an expert, keep slot order t*k + j (stable sort)":
        "同一专家内，请保持槽位顺序 t*k + j（稳定排序）",
    # merge_attention_blocks (ring attention's online softmax)
    "ordinary logits": "普通 logits",
    "large logits, lse in the thousands": "很大的 logits，lse 达数千",
    "block a fully masked, lse_a = -inf": "块 a 被完全掩码，lse_a = -inf",
    "block b fully masked, lse_b = -inf": "块 b 被完全掩码，lse_b = -inf",
    "not renormalised: divide by the total weight, i.e. weight each by exp(lse_block - lse)":
        "没有重新归一化：要除以总权重，即每个块的权重为 exp(lse_block - lse)",
    "lse = log(exp(lse_a) + exp(lse_b)) (torch.logaddexp)":
        "lse = log(exp(lse_a) + exp(lse_b))（torch.logaddexp）",
    "weights the blocks equally; weight each by exp(lse_block - lse)":
        "对两个块等权平均；每个块的权重应为 exp(lse_block - lse)",
    "weights swapped: out_a's weight is exp(lse_a - lse)":
        "权重弄反了：out_a 的权重是 exp(lse_a - lse)",
    "returns out_a: block b's keys count too": "返回了 out_a：块 b 的键也要算进去",
    "returns out_b: block a's keys count too": "返回了 out_b：块 a 的键也要算进去",
    "lse_a + lse_b: the blocks' sums of exp add, so {logaddexp}":
        "lse_a + lse_b：相加的应是两个块的 exp 之和，所以 {logaddexp}",
    "the larger block's lse: add both blocks' sums, {logaddexp}":
        "取了较大块的 lse：要把两个块的 exp 之和相加，{logaddexp}",
    "averages the lse: {logaddexp}": "对 lse 求了平均：{logaddexp}",
    "{what} has inf/NaN with large logits: exp(lse) overflows; subtract the maximum first "
    "(weight = exp(lse_block - lse) <= 1, lse by torch.logaddexp)":
        "logits 很大时 {what} 出现 inf/NaN：exp(lse) 溢出；请先减去最大值（权重 = "
        "exp(lse_block - lse) <= 1，lse 用 torch.logaddexp 计算）",
    "{what} has NaN where block {block} is fully masked (lse_{block} = -inf): its weight must "
    "be 0 and lse = lse_{other}; -inf - (-inf) is NaN, so anchor on the larger lse (the max)":
        "块 {block} 被完全掩码（lse_{block} = -inf）时 {what} 出现 NaN：它的权重必须为 0，且 "
        "lse = lse_{other}；-inf - (-inf) 是 NaN，所以要以较大的 lse（最大值）为基准",
    "expected (out, lse), two tensors; got {what}": "应为 (out, lse) 两个张量；实际为 {what}",
    "{name}: shape {got}, expected {want} (the shape of {name}_a)":
        "{name}：形状为 {got}，应为 {want}（即 {name}_a 的形状）",
    "{where}: {problem}": "{where}：{problem}",
    "check_merge_attention_blocks needs your function itself, e.g. "
    "lu.check_merge_attention_blocks(my_merge)":
        "check_merge_attention_blocks 需要传入函数本身，例如 "
        "lu.check_merge_attention_blocks(my_merge)",
    "[ok] {name}: {total} cases passed, equal to attention over both blocks' keys at once":
        "[通过] {name}：{total} 个用例全部通过，与一次对两个块的全部键计算的注意力相等",
    # exercises.lab03a: the ring checker's typical mistakes
    "[wrong] ring_all_reduce: every result is right, but {meaning}":
        "[错误] ring_all_reduce：每个结果都正确，但{meaning}",
    "the answer calls the collective(s) {ops}: build the all-reduce from point-to-point "
    "messages only (dist.send/isend and dist.recv/irecv)":
        "答案调用了集合通信 {ops}：全归约只能用点对点消息（dist.send/isend 和 dist.recv/irecv）搭建",
    "every message goes to or from rank {root}: that is a reduce onto a root and a broadcast, "
    "whose root carries (p - 1) whole tensors each way; in a ring each rank sends only to its "
    "right neighbour":
        "每条消息都发往或来自 rank {root}：这是先归约到根再广播，根的链路每个方向都要承载 "
        "(p - 1) 个完整张量；在环中每个 rank 只向右邻居发送",
    "a blocking dist.send waits until its receiver posts the matching recv: when every rank "
    "sends first and receives after, they all wait forever; post the send with dist.isend, "
    "then recv, then wait on the send":
        "阻塞的 dist.send 要等到接收方发出对应的 recv 才返回：如果每个 rank 都先发送后接收，"
        "它们会永远互相等待；请用 dist.isend 发出发送，然后 recv，最后等待该发送完成",
    # ring_timing.slowest_words
    "rank {slow} was the slowest ({slow_time}); it was {verdict} rank {fast} ({fast_time}): "
    "{comparison}":
        "rank {slow} 最慢（{slow_time}）；它{verdict} rank {fast}（{fast_time}）：{comparison}",

    # parallel.ulysses.validate_ulysses_config
    "world_size must be >= 1; got {world_size}": "world_size 必须 >= 1；实际为 {world_size}",
    "num_heads={num_heads} is not divisible by world_size={world_size}: use a world size that "
    "divides {num_heads} ({ok}) or change num_heads":
        "num_heads={num_heads} 不能被 world_size={world_size} 整除：请使用能整除 {num_heads} "
        "的进程总数（{ok}），或修改 num_heads",
    "seq_len={seq_len} is not divisible by world_size={world_size}: each rank holds "
    "seq_len/world_size positions; pad the sequence or use a world size that divides {seq_len}":
        "seq_len={seq_len} 不能被 world_size={world_size} 整除：每个 rank 持有 "
        "seq_len/world_size 个位置；请填充序列，或使用能整除 {seq_len} 的进程总数",

    # ---- viz.widgets: the knob panels --------------------------------------------------
    "Run": "运行",
    "Stop": "停止",
    "run the experiment with these settings": "用这些设置运行实验",
    "end every rank of this run": "结束本次运行的所有 rank",
    "ready": "就绪",
    "running…": "运行中…",
    "stopping…": "正在停止…",
    "stopped": "已停止",
    "error": "出错",
    "error: {error}": "错误：{error}",
    "done in {seconds:.1f} s": "完成，用时 {seconds:.1f} 秒",
    "(plot drew nothing)": "（绘图函数没有画出任何内容）",
    "a run is already under way; wait for it or press Stop": "已有一次运行在进行；请等待它结束或按“停止”",
    "steps": "步",
    "repeats": "次重复",
    "rounds": "个回合",
    "updates": "次更新",
    "seeds": "个种子",
    "a routing decision is within {gap:.1e} of a tie (limit {limit}): its counts could differ "
    "on another CPU; use another seed":
        "有一个路由决策与平局只差 {gap:.1e}（下限 {limit}）：在另一种 CPU 上计数可能不同；请换一个种子",
    "{num_experts} experts cannot be split evenly over {world_size} ranks (expert parallelism "
    "gives each rank E/N experts). Use a world size in {fits}, or a number of experts divisible "
    "by {world_size}.":
        "{num_experts} 个专家无法平均分到 {world_size} 个 rank 上（专家并行给每个 rank E/N 个专家）。"
        "请使用 {fits} 中的 world size，或使用能被 {world_size} 整除的专家数",
    "cannot split a model of {n_layers} layers into {n_stages} stages: use at most {n_layers} "
    "stages (world_size <= {n_layers}) or a deeper model":
        "无法把 {n_layers} 层的模型切成 {n_stages} 个阶段：最多使用 {n_layers} 个阶段"
        "（world_size <= {n_layers}），或使用更深的模型",
    "{median} {unit} (min {lo}, max {hi}, n={n})": "{median} {unit}（最小 {lo}，最大 {hi}，n={n}）",
    "{ratio}x (95% CI {lo}-{hi}, {n} paired rounds)":
        "{ratio} 倍（95% 置信区间 {lo}-{hi}，{n} 个配对回合）",
    "{ratio}x (95% CI {lo}-{hi}; Mann-Whitney p={p}, {na} vs {nb} samples)":
        "{ratio} 倍（95% 置信区间 {lo}-{hi}；Mann-Whitney 检验 p={p}，样本数 {na} 对 {nb}）",
}

# ---- course.show_map: the course map in the Chinese edition (the README's stays English) ----
COURSE_HEADER = ("文章章节", "笔记本", "labutils", "内容", "笔记本电脑上的分钟数", "CPU/GPU")
COURSE_DEVICES = {"CPU (GPU optional)": "CPU（GPU 可选）"}
COURSE_COMING = "（即将推出）"
COURSE_SHOWS = {  # Lab.shows (English, character for character) -> Chinese
    "this machine; a first 2-rank all-reduce from a notebook cell; what a failing or deadlocked"
    " rank looks like; training FLOPs (counted) and time vs data and model size; a data split"
    " timed inside the ranks, launch cost apart":
        "这台机器；在笔记本单元格里运行第一个 2 个 rank 的全归约；出错或死锁的"
        " rank 是什么样子；训练的 FLOPs（计数）以及时间随数据量和模型规模的变化；"
        "在各 rank 内部计时的数据切分，启动开销单独列出",
    "dynamic graphs, autograd vs finite differences, grad_fn and saved tensors, a training "
    "loop on real digits, saving weights; the torch.distributed map with each launcher run "
    "once":
        "动态图，自动微分与有限差分的对照，grad_fn 与保存的张量，在真实手写数字上的训练循环，"
        "保存权重；torch.distributed 全景图，每种启动器各运行一次",
    "data vs model parallelism; every collective on real ranks, drawn; ring all-reduce from"
    " send/recv vs dist.all_reduce; bytes per link and message steps counted (ring, recursive"
    " doubling, via a root); latency and bandwidth fitted (alpha-beta) with their spread":
        "数据并行与模型并行；每种集合通信都在真实 rank 上运行并画出来；"
        "用 send/recv 实现的环形全归约与 dist.all_reduce 对照；计数每条链路的字节数和消息步数（环形、"
        "递归倍增、经由根节点）；拟合延迟和带宽（α-β 模型）并给出离散范围",
    "sync SGD, a parameter server and Hogwild at equal work; a straggler; what staleness does"
    " to convergence, a parameter server replayed from its trace":
        "在相同工作量下比较同步 SGD、参数服务器与 Hogwild；掉队者；陈旧度对收敛的影响，"
        "按轨迹重放的参数服务器",
    "image, language and video workloads on 1 and 2 ranks; compute-to-communication ratio and"
    " what it does and does not explain":
        "图像、语言和视频负载在 1 个和 2 个 rank 上运行；计算与通信之比，"
        "以及它能解释和不能解释的东西",
    "small messages vs buckets; compression, and when it pays":
        "小消息与桶的对照；压缩，以及它何时划算",
    "set_epoch and its effect on training, BatchNorm per rank vs synchronised, nondeterminism;"
    " memory of weights, gradients, optimiser state, activations; oversubscription":
        "set_epoch 及其对训练的影响，逐 rank 的 BatchNorm 与同步 BatchNorm"
        " 的对照，非确定性；权重、梯度、优化器状态和激活值的内存；超额订阅",
    "naive gradient all-reduce, hooks, buckets with overlap; each checked equal to one process"
    " and to PyTorch's DDP":
        "朴素的梯度全归约、钩子、带重叠的桶；每一种都检查与单进程以及 PyTorch"
        " 的 DDP 相等",
    "DistributedSampler, no_sync accumulation, compression hooks, exact resume from a checkpoint,"
    " torchrun with a killed worker":
        "DistributedSampler，no_sync 梯度累积，压缩钩子，从检查点精确恢复，"
        "杀掉一个工作进程的 torchrun",
    "strong and weak scaling with error bars, per-rank timelines, bucket sweep vs cost model,"
    " a shared-memory all-reduce, speedup on emulated 100 Mb-10 Gb links with buckets, overlap"
    " and bf16":
        "带误差范围的强扩展与弱扩展，逐 rank 的时间线，桶大小扫描与成本模型的对照，"
        "共享内存全归约，在仿真的 100 Mb-10 Gb 链路上使用桶、重叠和 bf16"
        " 的加速比",
    "the memory wall, per-rank peaks measured vs the formula; a naive layer split with send/recv"
    " checked equal to one process; its idle timeline; micro-batches with send vs isend measured"
    " against (p-1)/(m+p-1); splitting a matmul":
        "内存墙，逐 rank 实测峰值与公式的对照；用 send/recv 实现的朴素层切分，"
        "检查与单进程相等；它的空闲时间线；微批次，实测 send 与 isend 并与"
        " (p-1)/(m+p-1) 对照；切分矩阵乘法",
    "GPipe and 1F1B from send/recv, checked equal; bubbles counted and measured (emulated compute)"
    " vs (p-1)/(m+p-1); torch.distributed.pipelining incl. interleaved 1F1B and zero bubble;"
    " activation bytes; stage balance":
        "用 send/recv 实现的 GPipe 和 1F1B，检查相等；气泡的计数与实测（仿真的计算）"
        "并与 (p-1)/(m+p-1) 对照；torch.distributed.pipelining，包括交错式"
        " 1F1B 和零气泡；激活值字节数；阶段均衡",
    "Megatron column/row-parallel layers, parallel MLP, attention and layer, checked equal;"
    " bytes and all-reduces per layer; a layer timed on 1 rank vs TP vs DP, with timelines;"
    " torch.distributed.tensor.parallel":
        "Megatron 列并行/行并行层、并行 MLP、注意力和整层，检查相等；每层的字节数和全归约次数；"
        "一层分别在 1 个 rank、张量并行和数据并行下计时，附时间线；torch.distributed.tensor.parallel",
    "ZeRO 1/2/3 from scratch and FSDP2, checked equal (padding included); ZeRO-3 around a tied-head"
    " GPT equal to fully_shard; measured peak minus activations within 5% of the ZeRO formula"
    " per stage; checkpointing and bf16 timed with spread; a 2-D mesh; an interleaved optimisation"
    " walk-through":
        "从零实现的 ZeRO 1/2/3，以及 FSDP2，检查相等（包括填充）；包在输出头与嵌入共享权重的"
        " GPT 外的 ZeRO-3 与 fully_shard 相等；每个阶段实测峰值减去激活值，"
        "与 ZeRO 公式相差不超过 5%；带离散范围计时的激活检查点与 bf16；"
        "二维网格；交错进行的优化演练",
    "Megatron sequence parallelism (same bytes as TP, activation memory counted against the"
    " formula), ring attention with online softmax, zig-zag balance and a measured overlap "
    "timeline, Ulysses all-to-all attention, expert parallelism for a mixture-of-experts layer"
    " with capacity and dropped slots counted: each checked equal to one process (outputs and"
    " every gradient) on 2, 3 and 4 ranks":
        "Megatron 序列并行（字节数与张量并行相同，激活值内存计数并与公式对照）"
        "，带在线 softmax 的环形注意力、锯齿形均衡和实测的重叠时间线，Ulysses"
        " 全交换注意力，混合专家层的专家并行，计数容量与被丢弃的槽位：每一种都在"
        " 2、3、4 个 rank 上检查与单进程相等（输出和每个梯度）",
    "the cost model fitted here, tested on held-out all-reduces and real DDP steps (an emulated"
    " link only checks the emulator); a planner (GQA, SwiGLU, interleaving, sequence and context"
    " parallelism, expert parallelism, selective recomputation) tested on published runs it"
    " was not fitted to, against a baseline, and extrapolated term by term to 4,096 GPUs":
        "在这里拟合的成本模型，在留出的全归约和真实 DDP 步上检验（仿真链路只检验仿真器）"
        "；一个规划器（GQA、SwiGLU、交错、序列并行与上下文并行、专家并行、"
        "选择性重计算），在未参与拟合的已发表训练上检验，与基线对照，并逐项外推到"
        " 4,096 个 GPU",
}
