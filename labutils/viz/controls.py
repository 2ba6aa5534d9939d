"""The pieces of a knob panel (``widgets.panel``): a control built from a short spec (a
slider from ``(min, max[, step[, value]])``, a dropdown from ``[options]``, a checkbox from
``bool``), and a result, a figure or an error shown as the panel's output."""
from __future__ import annotations

import base64
import io
import math

import ipywidgets as W

from labutils.core import errors

_CONTROL_HELP = ("use (min, max[, step[, value]]) for a slider, [options] for a dropdown, "
                 "True/False for a checkbox, an ipywidgets widget, or ipywidgets.fixed(value)")


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _slider(name, spec):
    if not 2 <= len(spec) <= 4 or not all(_is_number(x) for x in spec):
        raise TypeError(f"control {name}={spec!r}: a slider is (min, max[, step[, value]]) "
                        f"of numbers")
    lo, hi = spec[0], spec[1]
    ints = all(isinstance(x, int) for x in spec)
    step = spec[2] if len(spec) > 2 else (1 if ints else (hi - lo) / 100)
    if not lo < hi or step <= 0:
        raise ValueError(f"control {name}={spec!r}: need min < max and step > 0")
    if len(spec) == 4:
        value = spec[3]
        if not lo <= value <= hi:
            raise ValueError(f"control {name}={spec!r}: value {value} is outside [{lo}, {hi}]")
    elif ints:
        value = lo + (hi - lo) // 2 // step * step
    else:
        value = lo + round((hi - lo) / 2 / step) * step
    style = {"description_width": "initial"}
    if ints:
        return W.IntSlider(value=value, min=lo, max=hi, step=step, description=name,
                           style=style, continuous_update=False)
    digits = max(0, -math.floor(math.log10(step))) if step < 1 else 1
    return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=name,
                         readout_format=f".{digits}f", style=style, continuous_update=False)


def make_control(name, abbrev):
    """The widget for one ``name=abbrev`` (None for ``ipywidgets.fixed``)."""
    style = {"description_width": "initial"}
    if isinstance(abbrev, W.fixed):
        return None
    if isinstance(abbrev, W.Widget):
        if not hasattr(abbrev, "value"):
            raise TypeError(f"control {name}: a {type(abbrev).__name__} has no value; "
                            f"{_CONTROL_HELP}")
        if hasattr(abbrev, "description") and not abbrev.description:
            abbrev.description = name
        return abbrev
    if isinstance(abbrev, bool):
        return W.Checkbox(value=abbrev, description=name, indent=False)
    if isinstance(abbrev, tuple):
        return _slider(name, abbrev)
    if isinstance(abbrev, (list, dict)):
        if not abbrev:
            raise ValueError(f"control {name}: a dropdown needs at least one option")
        return W.Dropdown(options=abbrev, description=name, style=style)
    if isinstance(abbrev, str):
        return W.Text(value=abbrev, description=name, style=style, continuous_update=False)
    raise TypeError(f"control {name}={abbrev!r}: {_CONTROL_HELP}")


def _figure_output(fig):
    """A matplotlib figure as a PNG display_data output (what the inline backend shows)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    width, height = fig.get_size_inches() * fig.dpi
    return {"output_type": "display_data", "metadata": {},
            "data": {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                     "text/plain": f"<Figure size {width:g}x{height:g} with "
                                   f"{len(fig.axes)} Axes>"}}


def _text_output(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text if text.endswith("\n")
            else text + "\n"}


def describe_error(e):
    """``rank N: ExcType: message`` for launch errors, ``ExcType: message`` otherwise."""
    if isinstance(e, errors.WorkerError):
        return str(e)
    return f"{type(e).__name__}: {e}"
