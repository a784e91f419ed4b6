"""Hooks for every test run in this repository (tests/, e2e/, images/smoke/)."""

from tests.support.run_summary import pytest_terminal_summary as pytest_terminal_summary
