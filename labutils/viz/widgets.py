"""Knob panels: rerun a lab's main experiment with other settings, without touching the code.

Every lab's main experiment gets one (first in ``01_introduction``)::

    def run(world_size, n):               # the plain function the notebook also calls
        return lu.launch(experiment, n, world_size=world_size)

    panel = lu.widgets.panel(run, plot_fn, title="All-reduce", world_size=(1, 4), n=[8, 64])
    panel                                 # sliders, Run, Stop, progress bar, plot

Controls follow ``ipywidgets.interact``: ``(min, max[, step[, value]])`` is an int or float
slider starting at its midpoint, ``[options]`` (or a dict) a dropdown, ``True``/``False`` a
checkbox, a string a text box, an ipywidgets widget is used as is, ``ipywidgets.fixed(v)``
passes ``v`` without a control.

The controls open with the values the notebook's own run used: the function's defaults,
overridden by ``values={...}`` (a value the control cannot show is refused, naming the fix).

The run happens in a background thread so the kernel stays responsive: the Run button is
disabled until it ends (a double click never starts two jobs); Stop, or JupyterLab's Stop
(the kernel interrupt), ends every rank and shows "stopped: every rank was ended", also when
pressed before the ranks started (the launch then starts nothing); rank output and rank 0's
``lu.progress`` calls go to the panel (``job.output_to``); a new run clears the last one's
result, error and status; an error shows as ``error: rank N: ExcType: message``. While it
runs, the status shows the elapsed seconds every second and, once a round is done, an estimate
of what is left (before that: "warming up"); a launch with more ranks than cores writes its
oversubscription warning in the panel's log, as one line. The panel's outputs are widget *state* (``Output.outputs``), so they work
from a thread and can be tested without a browser. ``Panel.run(**overrides)`` runs it from
code and returns the result (or raises).
"""
from __future__ import annotations

import inspect
import threading
import time

import ipywidgets as W

from labutils.core import errors, job
from labutils.core.i18n import tr
from labutils.viz.controls import (
    _figure_output,
    _text_output,
    describe_error,
    make_control,
)

_LOG_LINES = 200  # rank output kept in the panel's log


def _unit(desc):
    """The progress bar's unit in the notebook's language. Rank 0 names it ("steps") in a
    rank, which does not know the language; the panel translates the units the labs use."""
    return {"steps": tr("steps"), "repeats": tr("repeats"), "rounds": tr("rounds"),
            "updates": tr("updates"), "seeds": tr("seeds")}.get(desc, desc)


class Panel:
    """Controls, Run and Stop buttons, a progress bar, a log and an output area around
    ``run(**values)``; ``plot(result)`` draws the result (replaced on every run)."""

    TICK_S = 1.0   # how often the status shows the elapsed time and the estimate

    def __init__(self, run, plot=None, *, title="", values=None, **controls):
        if not callable(run):
            raise TypeError(f"run must be the experiment's plain function, called as "
                            f"run(**values); got {type(run).__name__}")
        if plot is not None and not callable(plot):
            raise TypeError(f"plot must be a function plot(result) returning a matplotlib "
                            f"Figure (or None); got {type(plot).__name__}")
        self._run_fn, self._plot_fn, self.title = run, plot, str(title)
        self.controls, self.fixed = {}, {}
        for name, abbrev in controls.items():
            widget = make_control(name, abbrev)
            if widget is None:
                self.fixed[name] = abbrev.value
            else:
                self.controls[name] = widget
        self._check_signature(run, list(controls))
        self._open_with(run, dict(values or {}))
        self.result, self.error = None, None
        self._sink = None
        self._lines = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._done.set()
        self._stop_requested = False
        self._build()

    def _open_with(self, run, values):
        """Set each control to the value the notebook's run used: ``values``, else the
        function's default; refuse one the control cannot show."""
        unknown = set(values) - set(self.controls) - set(self.fixed)
        if unknown:
            raise TypeError(f"values: no control called {sorted(unknown)[0]!r}")
        try:
            defaults = {k: p.default for k, p in inspect.signature(run).parameters.items()
                        if p.default is not inspect.Parameter.empty}
        except (TypeError, ValueError):
            defaults = {}
        for name, widget in self.controls.items():
            if name not in values and name not in defaults:
                continue
            value = values.get(name, defaults.get(name))
            options = getattr(widget, "options", None)
            if options is not None:
                labels = options.values() if isinstance(options, dict) else [
                    o[1] if isinstance(o, tuple) else o for o in options]
                ok = value in list(labels)
            elif hasattr(widget, "min") and hasattr(widget, "max"):
                ok = widget.min <= value <= widget.max
            else:
                ok = True
            if not ok:
                raise ValueError(f"control {name}: the experiment runs with {name}={value!r}, "
                                 f"which the control cannot show; add it to the control's "
                                 f"options or range, or pass values={{{name!r}: ...}}")
            widget.value = value
        self.initial = dict(self.values)

    @staticmethod
    def _check_signature(run, names):
        try:
            signature = inspect.signature(run)
        except (TypeError, ValueError):  # builtins: nothing to check
            return
        try:
            signature.bind(**dict.fromkeys(names))
        except TypeError as e:
            raise TypeError(f"run{signature} cannot be called with the panel's controls "
                            f"{names}: {e}; give a control (or ipywidgets.fixed) for each of "
                            f"its arguments") from None

    def _build(self):
        self.run_button = W.Button(description=tr("Run"), icon="play", button_style="primary",
                                   tooltip=tr("run the experiment with these settings"))
        self.stop_button = W.Button(description=tr("Stop"), icon="stop", disabled=True,
                                    tooltip=tr("end every rank of this run"))
        self.progress = W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="240px"))
        self.progress_label = W.Label("")
        self.status = W.Label(tr("ready"))
        self.log = W.Output(layout=W.Layout(max_height="160px", overflow="auto"))
        self.output = W.Output()
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        rows = [W.Box(list(self.controls.values()), layout=W.Layout(flex_flow="row wrap")),
                W.HBox([self.run_button, self.stop_button, self.progress,
                        self.progress_label]),
                self.status, self.log, self.output]
        if self.title:
            rows.insert(0, W.HTML(f"<b>{self.title}</b>"))
        self.widget = W.VBox(rows)
        self.widget.add_class("lu-panel")

    # -- state ---------------------------------------------------------------------------
    @property
    def values(self):
        """The keyword arguments the next run gets: control values and fixed values."""
        return {**{name: w.value for name, w in self.controls.items()}, **self.fixed}

    @property
    def running(self):
        return not self._done.is_set()

    def _set_busy(self, busy):
        self.run_button.disabled = busy
        self.stop_button.disabled = not busy

    # -- sinks for the launcher (called in the run's thread) -----------------------------
    def _write(self, line):
        self._lines.append(line)
        del self._lines[:-_LOG_LINES]
        self.log.outputs = (_text_output("\n".join(self._lines)),)

    def _on_progress(self, n, total, desc):
        self.progress.max = max(1, total)
        self.progress.value = max(0, min(n, total))
        self.progress_label.value = f"{_unit(desc)} {n}/{total}".strip()
        self._done_of = (n, total)

    def _tick(self):
        """The status while running: elapsed seconds, and an estimate once a round is done (the
        warm-up round comes first and reports nothing, so a bar at 0 is not a frozen run)."""
        with self._lock:
            if self._done.is_set() or self._stop_requested:   # "stopping…" stays
                return
            elapsed = time.monotonic() - self._started
            n, total = self._done_of
            if 0 < n < total:
                self.status.value = tr("running… {seconds:.0f} s, about {left:.0f} s left",
                                       seconds=elapsed, left=elapsed / n * (total - n))
            elif n == 0:
                self.status.value = tr("running… {seconds:.0f} s (warming up: no round done yet)",
                                       seconds=elapsed)
            else:
                self.status.value = tr("running… {seconds:.0f} s", seconds=elapsed)

    def _ticker(self, every):
        while not self._done.wait(every):
            self._tick()

    # -- running ---------------------------------------------------------------------------
    def start(self, **overrides):
        """Start a run in the background; False (and nothing started) if one is running."""
        unknown = set(overrides) - set(self.controls) - set(self.fixed)
        if unknown:
            raise TypeError(f"no control called {sorted(unknown)[0]!r}; the panel has "
                            f"{sorted(self.controls) + sorted(self.fixed)}")
        with self._lock:
            if self.running:
                return False
            for name, value in overrides.items():
                if name in self.controls:
                    self.controls[name].value = value
            values = {**self.values, **{k: v for k, v in overrides.items() if k in self.fixed}}
            self._done.clear()
            self._stop_requested = False
            self._set_busy(True)
        self.result = self.error = None
        self._lines = []
        self.log.outputs = ()
        self.output.outputs = ()     # the last run's plot or error must not sit beside this one
        self.progress.value, self.progress_label.value = 0, ""
        self.status.value = tr("running…")
        self._started, self._done_of = time.monotonic(), (0, 0)
        threading.Thread(target=self._work, args=(values,), daemon=True,
                         name=f"lu-panel-{self.title}").start()
        threading.Thread(target=self._ticker, args=(self.TICK_S,), daemon=True,
                         name=f"lu-panel-clock-{self.title}").start()
        return True

    def _work(self, values):
        start = time.monotonic()
        status = tr("error")
        try:
            with job.output_to(self._write, self._on_progress) as sink:
                self._sink = sink
                sink.stopped = self._stop_requested   # Stop pressed before this line
                result = self._run_fn(**values)
            self.result = result
            self.output.outputs = self._draw(result)
            status = tr("done in {seconds:.1f} s", seconds=time.monotonic() - start)
        except errors.LaunchStopped as e:
            self.error = e
            self.output.outputs = (_text_output(tr("stopped: every rank was ended"), "stderr"),)
            status = tr("stopped")
        except Exception as e:  # noqa: BLE001 - any error shows in the panel, which stays usable
            self.error = e
            self.output.outputs = (_text_output(tr("error: {error}", error=describe_error(e)),
                                                "stderr"),)
        finally:
            with self._lock:   # under the clock's lock: its last tick cannot overwrite this
                self.status.value = status
                self._sink = None
                self._set_busy(False)
                self._done.set()

    def _draw(self, result):
        """The outputs showing ``result``: the plot's figures, or its repr."""
        if self._plot_fn is None:
            return ({"output_type": "execute_result", "execution_count": None,
                     "metadata": {}, "data": {"text/plain": repr(result)}},)
        import matplotlib.pyplot as plt
        before = set(plt.get_fignums())
        returned = self._plot_fn(result)
        if returned is not None and not hasattr(returned, "savefig"):
            returned = getattr(returned, "figure", None)  # an Axes
        figures = [returned] if returned is not None else []
        figures += [plt.figure(n) for n in plt.get_fignums()
                    if n not in before and plt.figure(n) is not returned]
        outputs = tuple(_figure_output(fig) for fig in figures)
        for fig in figures:
            plt.close(fig)  # or the inline backend would also show it under a later cell
        return outputs or (_text_output(tr("(plot drew nothing)")),)

    def stop(self):
        """End the ranks of the current run, and refuse any launch it would start next (the
        run ends with LaunchStopped); no-op when idle."""
        if not self.running:
            return
        self._stop_requested = True
        sink = self._sink
        if sink is not None:
            sink.stopped = True
        self.status.value = tr("stopping…")

    def wait(self, timeout=None):
        """Wait for the current run to end; True if it has."""
        return self._done.wait(timeout)

    def run(self, wait=True, **overrides):
        """Run with the controls (changed by ``overrides``); return the result or raise its
        error. ``wait=False`` starts it and returns None."""
        if not self.start(**overrides):
            raise RuntimeError(tr("a run is already under way; wait for it or press Stop"))
        if not wait:
            return None
        self.wait()
        if self.error is not None:
            raise self.error
        return self.result

    # -- display: the widget, with a text/plain that is the same on every run (nbval) ----
    def __repr__(self):
        return f"Panel({self.title!r})"

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = repr(self)
        return bundle


def panel(run, plot=None, *, title="", values=None, **controls):
    """A :class:`Panel` around ``run(**values)``; show it as a cell's last expression."""
    return Panel(run, plot, title=title, values=values, **controls)
