"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="module")
def chromium(missing_system_package) -> str:  # tests/conftest.py's skip (fails on CI)
    """The system's Chromium, which Playwright drives headless."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        missing_system_package("no Chromium browser found (set CHROMIUM, or install Debian's package: apt-get "
                               "install chromium); `./platform test` installs it when run as root")
    return path
