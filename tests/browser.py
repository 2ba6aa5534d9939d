"""What the browser tests share: Debian's Chromium, and the rule for when it is missing."""
import os

import pytest

CHROMIUM = "/usr/bin/chromium"


def require_chromium():
    """Never a silent skip: a missing browser fails with how to install it, unless
    SKIP_BROWSER=1 asks explicitly to skip (CI never sets it)."""
    if os.access(CHROMIUM, os.X_OK):
        return
    message = (f"Chromium is not installed at {CHROMIUM}: `make test` installs Debian's "
               f"chromium with apt-get (or: sudo apt-get install chromium); set "
               f"SKIP_BROWSER=1 to skip this test explicitly")
    if os.environ.get("SKIP_BROWSER") == "1":
        pytest.skip(message)
    pytest.fail(message)
