"""The daemon soak (benchmarks/soak.py), short: a few minutes of new hours landing every 30 s
under a real `dagster-daemon`, with a late file, a deleted index and a killed run, then every
refusal and failure kind. Every hour loads exactly once, no sensor tick fails, no tick error in the
daemon log, and the UI's partition status of every hour equals the commit records. The landing sensor looks
every 10 s (`landing.check_every`; 30 s by default) so the walk's waits stay short."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import soak

pytestmark = pytest.mark.slow


def test_short_soak(tmp_path: Path) -> None:
    fig = soak(tmp_path, minutes=2, every=30, check_every=10)
    print(fig.report())
    assert fig.ok(), fig.report()
    assert fig.killed_run and fig.killed_status == "FAILURE", fig.report()
    assert fig.retries_of_killed >= 1 and fig.check_runs >= 1, fig.report()
    assert fig.ui_truth == "equal", fig.report()
    assert set(fig.refusals) == {"later hours loaded", "lock", "contract", "no partition",
                                 "Spark failure of a rerun", "cancelled"}, fig.report()
    assert "succeeded?!" not in fig.refusals.values(), fig.report()
