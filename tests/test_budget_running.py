"""A running session when the month's budget runs out during it (docs/cost.md): a real session on
the local backend, watched by the notebook's background poll (faces/notify.py WarningNotifier,
what `%gpu start` runs in the notebook), while other spend of the month is recorded in the store.

At 80% and again at 100% the notebook prints one line each, the sidebar's view carries the
warning (its idle warning line and `budget_alert`, which JupyterLab notifies once per level),
and the session keeps running; only an administrator's policy with `stop_at_monthly_cap` stops
it, saying so in one line."""

from __future__ import annotations

import json
import threading
import time

import pytest
from test_cli import cli
from test_spend import _session

from gpusession.configuration.config import GpuSessionConfig
from gpusession.core.durations import format_money
from gpusession.core.models import State
from gpusession.faces.notify import WarningNotifier
from gpusession.session import SessionManager
from gpusession.words.spend import budget_line, report_rest
from gpusession.words.status import rest_view

# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration

H = 3600.0


def wait_for(lines: list[str], count: int, timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        assert time.monotonic() < deadline, f"only {lines} after {timeout:.0f} s"
        time.sleep(0.1)
    return lines


def spend_more(manager: SessionManager, name: str, dollars: float) -> None:
    """Another session of this month, ended, that cost `dollars` (a minute at that rate x 60)."""
    at = time.time()
    _session(manager.store, name, "t4", at, price=dollars * 60, billed=(70.0, 10.0))


def test_budget_runs_out_during_a_running_session(gs_home, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSESSION_POLICY", raising=False)
    # the polls share one reading of the store for READING_S (10 s): 1 s keeps this quick
    monkeypatch.setattr("gpusession.session.spend.READING_S", 1.0)
    manager = SessionManager(GpuSessionConfig(data_dir=str(gs_home)))
    spend_more(manager, "earlier", 8.5)
    manager.config.monthly_budget = 10.0  # 85%: the start warns, and goes ahead
    spent = manager.spend.budget()["spent"]
    assert 8.4 < spent < 8.6
    session = manager.start(manager.make_spec("t4", backend="local", idle="30s", name="b-run"))
    said: list[str] = []
    ended: list[str] = []
    notifier = WarningNotifier.for_session(
        manager, session.id, threading.Lock(), said.append, ended.append
    ).start()
    try:
        (warn,) = wait_for(said, 1)
        assert warn.startswith("[gpusession] WARNING: this month's GPU spend $8.5")
        assert warn.endswith(
            "% of the $10.00 monthly budget: this session keeps running; at 100% new starts "
            "are refused"
        ), warn
        # the sidebar: the card's warning line and the alert JupyterLab notifies once
        view = rest_view(manager.view(manager.get(session.id)))
        assert view["budget_alert"]["level"] == "warn"
        assert view["budget_alert"]["text"] == warn.removeprefix("[gpusession] WARNING: ")
        assert view["budget_alert"]["text"] in view["idle"]["warning"]

        spend_more(manager, "meanwhile", 2.0)  # the month's budget runs out during the session
        over = wait_for(said, 2)[1]
        assert "% of the $10.00 monthly budget: this session keeps running, new starts are " in over
        assert over.endswith("refused; stop it when you can (`%gpu stop`)"), over
        time.sleep(3.5)  # more polls: each level is said once
        assert len(said) == 2 and not ended, (said, ended)
        assert manager.refresh_state(session.id).state == State.RUNNING  # warned, never stopped
        assert session.run("x = 6 * 7")["status"] == "ok"
        assert rest_view(manager.view(manager.get(session.id)))["budget_alert"]["level"] == "over"

        # an administrator's policy that stops sessions at its monthly cap
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({"monthly_cap": 9, "stop_at_monthly_cap": True}))
        monkeypatch.setenv("GPUSESSION_POLICY", str(policy))
        (end,) = wait_for(ended, 1)
        assert str(policy) in end and "monthly cap" in end, end
        record = manager.get(session.id)
        assert record.state == State.STOPPED, record.state
        assert "monthly cap" in (record.stop_reason.by or "")
        assert len(said) == 2, said
    finally:
        notifier.stop()
        if manager.get(session.id).state.active:
            manager.stop(session.id)


def test_stop_at_monthly_cap_must_be_true_or_false(nb_env, tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"monthly_cap": 9, "stop_at_monthly_cap": "yes"}))
    r = cli(dict(nb_env, GPUSESSION_POLICY=str(policy)), "report")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert (
        f"the gpusession policy {policy} cannot be used (stop_at_monthly_cap must be " in r.stderr
    )
    assert "true or false" in r.stderr


def test_the_months_spend_is_one_figure_on_every_face_at_one_moment(gs_home, monkeypatch):
    """Issue 32 §5: one screen showed $0.1651 in the header, $0.1611 on the card and $0.1751 in
    the Spend view. The header (GET sessions' `budget_line`, which is `spend.budget()`), the
    card's warning (the view's idle warning) and the Spend view (GET report) read the store once
    and say the same dollars to the cent, while the month's spend moves under them (another
    session of the month ends between the card's stats poll and the Spend view's report)."""
    monkeypatch.delenv("GPUSESSION_POLICY", raising=False)
    manager = SessionManager(GpuSessionConfig(data_dir=str(gs_home)))
    spend_more(manager, "earlier", 0.085)
    manager.config.monthly_budget = 0.12  # small: four decimals; past 80% from the start
    session = manager.start(manager.make_spec("t4", backend="local", idle="5m", name="one-fig"))
    try:
        for n in range(3):
            manager.stats.fetch(session.id, limit=0)  # the card's stats, as the sidebar polls
            spend_more(manager, f"meanwhile-{n}", 0.0123)
            report = report_rest(manager.spend.report("1d", "type"))  # the Spend view
            header = budget_line(manager.spend.budget())  # GET sessions' budget_line
            card = rest_view(manager.view(manager.get(session.id)))["idle"]["warning"]
            money = format_money(report["budget"]["spent"])
            assert report["budget_line"] == header, (report["budget_line"], header)
            assert money in header and f"spend {money} is " in card, (money, header, card)
            # and the month's spend the report sums is that figure (the session's own month)
            assert format_money(report["total"]["cost"]) == money, report["total"]
    finally:
        manager.stop(session.id)
