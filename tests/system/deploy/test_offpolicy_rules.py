"""The off-policy alert rules pass promtool's check and their unit tests (skipped without promtool)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "rules"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_offpolicy_rules_check_and_unit_tests_pass():
    check = subprocess.run(["promtool", "check", "rules", "offpolicy.yml"], cwd=RULES, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "offpolicy_test.yml"], cwd=RULES, capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr
