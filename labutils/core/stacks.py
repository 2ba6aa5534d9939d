"""Stacks and exit codes of ranks, in words: a hung rank's faulthandler dump reduced to the
frames of its main thread, and a signal number turned into its name. The words are composed in
the launching process (``core.job``), which knows the notebook's language."""
import os
import re
import signal
import sys

from labutils.core.i18n import tr


def _describe_exit(rank, code):
    if code is None:
        return tr("rank {rank}: process ended without an exit status", rank=rank)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return tr("rank {rank}: process killed by signal {name}", rank=rank, name=name)
    return tr("rank {rank}: process exited with code {code} without returning a result",
              rank=rank, code=code)


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\)")


_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def _main_stack(text):
    """Frames (file, line, function) of the main thread, innermost first, from faulthandler."""
    lines = text.splitlines()
    main = lines[0].split()[1] if lines and lines[0].startswith("MAIN") else None
    blocks, current = {}, None
    for line in lines[1:]:
        if m := _THREAD.match(line):
            current = m.group(1)
            blocks[current] = []
        elif current is not None and (m := _FRAME.match(line)):
            blocks[current].append((m.group(1), int(m.group(2)), m.group(3)))
    return blocks.get(main) or next(iter(blocks.values()), [])


def _summarise_stack(frames):
    """'waiting in dist.recv, line 12 of fn' from the innermost frames."""
    if not frames:
        return tr("no Python stack could be read")
    here = os.path.dirname(os.path.abspath(__file__))
    machinery = tuple(os.path.join(here, name) for name in ("launcher.py", "rank.py"))
    user = next(((f, n, fn) for f, n, fn in frames
                 if "site-packages" not in f and not f.startswith(sys.prefix)
                 and os.path.join("multiprocessing", "") not in f
                 and not f.startswith(machinery)), None)
    inner_file, _, inner_fn = frames[0]
    if os.path.join("torch", "distributed") in inner_file:
        what = tr("waiting in dist.{fn}", fn=inner_fn)
    elif user is not None and frames[0] == user:
        what = tr("running")
    else:
        what = tr("in {fn}", fn=inner_fn)
    if user is not None:
        return tr("{what}, line {line} of {fn}", what=what, line=user[1], fn=user[2])
    return what
