"""The dashboard's browser tests' browser: Debian's headless Chromium, driven by Playwright.

Browsers cannot be downloaded here, so Playwright launches the system's
``chromium`` (``executable_path``); ``scripts/test`` installs it with apt, and
:func:`chromium` does too when a test runs as root without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import unavailable  # tests/conftest.py

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium() -> str:
    """Debian's Chromium; installed with apt-get when missing and we are root."""
    if not os.access(CHROMIUM, os.X_OK) and os.geteuid() == 0 and shutil.which("apt-get"):
        quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], env=quiet, check=False, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
            env=quiet,
            check=False,
            timeout=600,
        )
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"{CHROMIUM} is missing (Debian's chromium; scripts/test installs it as root)")
    return CHROMIUM


@contextmanager
def launch(path: str) -> Iterator[Any]:
    """A headless Chromium at ``path`` under Playwright, closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def screenshot_folder(default: Path) -> Path:
    """Where screenshots go: ``$PYPEPPER_SCREENSHOTS``, else ``default`` (made if missing)."""
    folder = Path(os.environ.get("PYPEPPER_SCREENSHOTS") or default)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
