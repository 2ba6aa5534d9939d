"""Benchmark ``emulated_ddp``: measured vs predicted speedup on emulated links."""
from labutils.bench.suite import Row
from labutils.cost import costmodel as cm
from labutils.experiments import emulated_ddp


def run(quick=False):
    """Emulated DDP steps against their link: the emulation waits until issue time + the
    model's all-reduce time, so no step may be shorter than the all-reduce of every gradient
    byte on the link (target: min step / floor >= 0.99); on 10 Mb/s one bucket is
    communication-bound (target: speedup over one rank < 0.5, as the model predicts)."""
    slow = cm.Link("10MbE", 1.25e6, 100e-6)
    width, depth = 96, 3
    rows_ = emulated_ddp.run(links=(slow, "1GbE"), steps=2 if quick else 6, width=width, depth=depth,
                batch=16)
    grad_bytes = (depth * (width * width + width) + width * 10 + 10) * 4
    rows = []
    for r in rows_:
        nbytes = grad_bytes / 2 if r["variant"] == "buckets + bf16" else grad_bytes
        link = slow if r["link"] == "10MbE" else cm.get_link(r["link"])
        floor = cm.allreduce_time(nbytes, 2, link.alpha, link.beta)
        rows.append(Row("emulated_ddp", f"{r['variant']} on {r['link']}: shortest step / link "
                        f"floor", r["step"].min / floor, "ratio", "target >= 0.99"))
    one = next(r for r in rows_ if r["link"] == "10MbE" and r["variant"] == "one bucket")
    rows.append(Row("emulated_ddp", "one bucket on 10 Mb/s: speedup over one rank",
                    float(one["measured"]), "x",
                    f"predicted {one['predicted']:.3g}; target < 0.5"))
    return rows
