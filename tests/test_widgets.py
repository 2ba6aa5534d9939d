"""lu.widgets panels without a browser: controls from abbreviations, Run calls the same plain
function with the control values, the button is disabled during a run, errors show with their
rank and the panel stays usable, Stop ends the ranks, progress and output reach the panel."""
import os
import threading
import time

import ipywidgets as W
import matplotlib
import psutil
import pytest
import torch
import torch.distributed as dist

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import labutils as lu  # noqa: E402
from labutils import widgets  # noqa: E402

pytestmark = [pytest.mark.lab01]


# ---- worker functions and experiments ----------------------------------------------------

def sum_of_ranks(rank, world_size, n, fail_on=None):
    for step in range(n):
        lu.progress(step + 1, n, "steps")
        print(f"step {step}")
    if rank == fail_on:
        raise ValueError(f"boom on rank {rank}")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def experiment(world_size, n, fail_on=None):
    return lu.launch(sum_of_ranks, n, world_size=world_size, fail_on=fail_on, timeout=60)


def bars(result):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.bar(range(len(result)), result)
    return fig


def sleep_and_record_pid(rank, world_size, pid_dir):
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---- controls ----------------------------------------------------------------------------

def test_controls_follow_interact_abbreviations():
    text = W.Textarea(value="x")
    p = widgets.panel(lambda **kw: kw, title="t", ws=(1, 4), lr=(0.0, 1.0), k=(1, 9, 2),
                      m=(1, 8, 1, 3), algo=["ring", "tree"], sizes={"small": 8, "big": 64},
                      overlap=True, note="hi", custom=text, seed=W.fixed(7))
    c = p.controls
    assert isinstance(c["ws"], W.IntSlider) and (c["ws"].min, c["ws"].max, c["ws"].value) == (1, 4, 2)
    assert isinstance(c["lr"], W.FloatSlider) and c["lr"].value == pytest.approx(0.5)
    assert isinstance(c["k"], W.IntSlider) and (c["k"].step, c["k"].value) == (2, 5)
    assert c["m"].value == 3
    assert isinstance(c["algo"], W.Dropdown) and c["algo"].value == "ring"
    assert c["sizes"].value == 8
    assert isinstance(c["overlap"], W.Checkbox) and c["overlap"].value is True
    assert isinstance(c["note"], W.Text)
    assert c["custom"] is text and text.description == "custom"
    assert "seed" not in c
    assert p.values == {"ws": 2, "lr": pytest.approx(0.5), "k": 5, "m": 3, "algo": "ring",
                        "sizes": 8, "overlap": True, "note": "hi", "custom": "x", "seed": 7}


def test_bad_controls_and_functions_are_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"\(min, max\[, step\[, value\]\]\)"):
        widgets.panel(lambda x: x, x=object())
    with pytest.raises(ValueError, match="min < max"):
        widgets.panel(lambda x: x, x=(4, 1))
    with pytest.raises(ValueError, match="outside"):
        widgets.panel(lambda x: x, x=(1, 4, 1, 9))
    with pytest.raises(TypeError, match="run must be"):
        widgets.panel(None, x=(1, 4))
    with pytest.raises(TypeError, match="plot must be"):
        widgets.panel(lambda x: x, "plot", x=(1, 4))
    with pytest.raises(TypeError, match=r"give a control .* for each of its arguments"):
        widgets.panel(lambda world_size, n: 0, world_size=(1, 4))  # n has no control
    with pytest.raises(TypeError, match=r"give a control"):
        widgets.panel(lambda world_size: 0, world_size=(1, 4), batch=[8])


def test_controls_open_with_the_values_the_notebook_ran():
    def run(world_size, n=64, schedule="1f1b", lr=0.05, overlap=False):
        return world_size, n, schedule, lr, overlap
    p = widgets.panel(run, world_size=[1, 2, 4], n=[8, 64, 512], schedule=["gpipe", "1f1b"],
                      lr=(0.01, 0.5), overlap=True, values={"world_size": 4})
    # the function's defaults and the values the notebook passed, not the first options
    assert p.values == {"world_size": 4, "n": 64, "schedule": "1f1b", "lr": 0.05,
                        "overlap": False}
    assert p.initial == p.values
    assert p.run() == (4, 64, "1f1b", 0.05, False)
    with pytest.raises(ValueError, match=r"runs with n=64, which the control cannot show"):
        widgets.panel(run, world_size=[1, 2], n=[8, 16])
    with pytest.raises(ValueError, match=r"runs with lr=0.05"):
        widgets.panel(run, world_size=[1, 2], lr=(0.1, 0.5))
    with pytest.raises(TypeError, match=r"values: no control called 'batch'"):
        widgets.panel(run, world_size=[1, 2], values={"batch": 3})


def test_display_text_is_the_same_on_every_run():
    a = widgets.panel(lambda n: n, title="All-reduce", n=(1, 4))
    b = widgets.panel(lambda n: n, title="All-reduce", n=(1, 4))
    bundle_a, bundle_b = a._repr_mimebundle_(), b._repr_mimebundle_()
    assert bundle_a["text/plain"] == bundle_b["text/plain"] == "Panel('All-reduce')"
    assert repr(a) == "Panel('All-reduce')"
    view = bundle_a["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == a.widget.model_id  # it displays the real widget


# ---- running (in-process functions: no ranks) ---------------------------------------------

def test_run_button_calls_the_same_function_with_the_control_values():
    calls = []

    def run(world_size, algo, seed):
        calls.append((world_size, algo, seed))
        return world_size * 10

    p = widgets.panel(run, title="t", world_size=(1, 8), algo=["ring", "tree"],
                      seed=W.fixed(3))
    p.controls["world_size"].value = 6
    p.controls["algo"].value = "tree"
    p.run_button.click()
    assert p.wait(10)
    assert calls == [(6, "tree", 3)] and p.result == 60 and p.error is None
    assert p.output.outputs[0]["data"]["text/plain"] == "60"  # no plot: repr of the result
    assert p.run(world_size=2) == 20  # overrides move the control too
    assert p.controls["world_size"].value == 2 and calls[-1] == (2, "tree", 3)
    with pytest.raises(TypeError, match="no control called 'wrold_size'"):
        p.run(wrold_size=2)


def test_button_disabled_during_a_run_and_double_click_starts_one_job():
    release, calls = threading.Event(), []

    def slow(n):
        calls.append(n)
        assert release.wait(20)
        return n

    p = widgets.panel(slow, n=(1, 4))
    assert not p.run_button.disabled and p.stop_button.disabled
    p.run_button.click()
    p.run_button.click()  # a double click while the first run is going
    assert p.running and p.run_button.disabled and not p.stop_button.disabled
    assert p.status.value.startswith("running")
    with pytest.raises(RuntimeError, match="already under way"):
        p.run()
    release.set()
    assert p.wait(20)
    assert calls == [2]
    assert not p.run_button.disabled and p.stop_button.disabled
    assert p.status.value.startswith("done in")


def test_plot_is_replaced_not_appended_and_figures_are_closed():
    plt.close("all")  # figures other tests left open are not the panel's
    p = widgets.panel(lambda n: list(range(1, n + 1)), bars, n=(1, 6))
    p.run(n=2)
    first = p.output.outputs
    p.run(n=5)
    second = p.output.outputs
    assert len(first) == len(second) == 1
    assert first[0]["data"]["image/png"] != second[0]["data"]["image/png"]
    assert second[0]["data"]["text/plain"].startswith("<Figure size")
    assert plt.get_fignums() == []  # nothing left for the inline backend to show again


def test_error_in_plot_shows_and_panel_stays_usable():
    def plot(result):
        if result == 3:
            raise KeyError("no such column")
        return bars([result])

    p = widgets.panel(lambda n: n, plot, n=(1, 4))
    with pytest.raises(KeyError):
        p.run(n=3)
    assert p.output.outputs[0]["text"] == "error: KeyError: 'no such column'\n"
    assert p.status.value == "error" and not p.run_button.disabled
    assert p.run(n=2) == 2 and "image/png" in p.output.outputs[0]["data"]


# ---- running real ranks -------------------------------------------------------------------

@pytest.mark.slow
def test_rank_output_progress_and_plot_reach_the_panel():
    p = widgets.panel(experiment, bars, title="sum", world_size=(1, 3), n=(1, 5, 1, 4))
    assert p.run() == [3.0, 3.0]
    log = p.log.outputs[0]["text"]
    assert log.splitlines() == [f"[rank {r}] step {s}" for r in (0, 1) for s in range(4)]
    assert (p.progress.value, p.progress.max, p.progress_label.value) == (4, 4, "steps 4/4")
    assert "image/png" in p.output.outputs[0]["data"]


@pytest.mark.slow
def test_error_shows_rank_and_message_and_the_panel_stays_usable():
    p = widgets.panel(experiment, bars, world_size=(1, 3), n=(1, 3), fail_on=[1, None],
                      values={"fail_on": 1})
    p.run_button.click()
    assert p.wait(60)
    assert isinstance(p.error, lu.WorkerError)
    assert p.output.outputs == ({"output_type": "stream", "name": "stderr",
                                 "text": "error: rank 1: ValueError: boom on rank 1\n"},)
    assert p.status.value == "error" and not p.run_button.disabled
    with pytest.raises(lu.WorkerError, match="rank 1: ValueError"):
        p.run()
    assert p.run(fail_on=None) == [3.0, 3.0] and p.error is None
    assert "image/png" in p.output.outputs[0]["data"]


def test_a_new_run_clears_the_last_runs_error_and_status():
    gate = threading.Event()

    def run(fail):
        gate.wait(30)
        if fail:
            raise ValueError("boom")
        return 1
    p = widgets.panel(run, fail=[True, False], values={"fail": True})
    gate.set()
    with pytest.raises(ValueError):
        p.run()
    assert p.status.value == "error" and "boom" in p.output.outputs[0]["text"]
    gate.clear()
    p.start(fail=False)
    assert p.status.value == "running…" and p.output.outputs == () and p.error is None
    gate.set()
    assert p.wait(30) and p.result == 1 and p.status.value.startswith("done")


@pytest.mark.slow
def test_stop_before_the_ranks_start_cancels_the_launch(tmp_path):
    started, go = threading.Event(), threading.Event()

    def run(world_size):
        started.set()
        go.wait(30)            # the experiment's set-up, before it launches
        return lu.launch(sleep_and_record_pid, str(tmp_path), world_size=world_size,
                         timeout=120)
    p = widgets.panel(run, world_size=[2])
    p.start()
    assert started.wait(30)
    p.stop()                   # pressed while the panel prepares: no rank exists yet
    go.set()
    assert p.wait(30)
    assert isinstance(p.error, lu.LaunchStopped) and p.status.value == "stopped"
    assert p.output.outputs[0]["text"] == "stopped: every rank was ended\n"
    assert list(tmp_path.glob("*.pid")) == []   # no rank was ever started


@pytest.mark.slow
def test_stop_ends_a_long_runs_ranks(tmp_path):
    def run(world_size):
        return lu.launch(sleep_and_record_pid, str(tmp_path), world_size=world_size,
                         timeout=120)

    p = widgets.panel(run, world_size=(1, 3))
    p.run_button.click()
    pid_files = [tmp_path / f"{r}.pid" for r in range(2)]
    wait_until(lambda: all(f.exists() and f.read_text() for f in pid_files), 60,
               "both ranks to start")
    pids = [int(f.read_text()) for f in pid_files]
    assert all(psutil.pid_exists(pid) for pid in pids)
    p.stop_button.click()
    assert p.wait(20), "Stop did not end the run"
    assert isinstance(p.error, lu.LaunchStopped)
    assert p.output.outputs[0]["text"] == "stopped: every rank was ended\n"
    wait_until(lambda: all(gone(pid) for pid in pids), 10, "the ranks to end")
    assert not p.run_button.disabled and p.stop_button.disabled


# ---- every lab's long runs move the panel's progress bar ----------------------------------

def _measure_in_caller():
    return lu.timing.measure(lambda: None, repeats=5, warmup=0)


def _train_steps():
    return lu.launch(lu.train.train_worker, "digits", steps=5, world_size=2)[0].losses


def _checkpointed_training():
    return lu.launch(lu.resumable_training.train_script, steps=4, batch_size=16, world_size=2)[0]


def _ddp_versions():
    return lu.launch(lu.ddp_performance.time_versions, hidden=32, batch_size=8, repeats=2, world_size=2)[0]


def _emulated_links():
    from labutils import emulated_ddp
    return emulated_ddp.run(["10GbE"], steps=2, width=32, depth=2, batch=16)


def _pipeline():
    return lu.pipeline_bubble.timed_pipeline(2, 2, "1f1b", batch_size=4, n_layers=2, ms_per_sample=0.1)


def _zero():
    return lu.zero_training.run_training("zero2", 2, steps=3)


def _all_reduce_sweep():
    return lu.collective_runs.measure_all_reduce([1024], world_size=2, impls=("gloo",), repeats=3)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", [_measure_in_caller, _train_steps,
                                        _checkpointed_training, _ddp_versions, _emulated_links,
                                        _pipeline, _zero, _all_reduce_sweep],
                         ids=lambda f: f.__name__.strip("_"))
def test_long_runs_drive_the_progress_bar(experiment):
    seen = []
    p = widgets.panel(lambda: experiment())
    original = p._on_progress

    def record(n, total, desc):
        seen.append((n, total, desc))
        original(n, total, desc)
    p._on_progress = record
    p.run()
    assert seen, "no progress reached the panel"
    n, total, desc = seen[-1]
    assert n == total and total >= 2 and desc in ("steps", "repeats")
    assert (p.progress.value, p.progress.max) == (total, total)
    assert p.progress_label.value == f"{desc} {total}/{total}"


def test_the_status_counts_the_warm_up_then_shows_elapsed_time_and_an_estimate():
    import labutils as lu
    warmed, finish = threading.Event(), threading.Event()

    def run(rounds):
        warmed.wait(30)
        lu.progress(1, rounds, "rounds")   # one round of four done
        finish.wait(30)
        return rounds

    def status_within(predicate, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if predicate(p.status.value):
                return p.status.value
            time.sleep(0.02)
        raise AssertionError(f"status stayed {p.status.value!r}")

    p = widgets.panel(run, rounds=[4])
    p.TICK_S = 0.05
    p.start()
    assert "warming up" in status_within(lambda s: "warming up" in s)   # not a frozen 0%
    warmed.set()
    late = status_within(lambda s: "left" in s)
    assert late.startswith("running…") and " s, about " in late
    finish.set()
    assert p.wait(30) and p.status.value.startswith("done")
    time.sleep(3 * p.TICK_S)
    assert p.status.value.startswith("done")   # the clock never writes over the final status


@pytest.mark.slow
def test_an_oversubscribed_launch_warns_in_the_panel_log_as_one_line():
    import labutils as lu

    def run(world_size):
        return lu.launch(_noop, world_size=world_size)

    world_size = lu.env.cpu_count() + 1
    p = widgets.panel(run, world_size=[world_size])
    assert p.run() == [None] * world_size
    warned = [line for line in p._lines if "oversubscription" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "/" not in warned[0]


def _noop(rank, world_size):
    return None
