"""The ipywidgets panel without a browser: real SessionManager, real local sessions (a separate
kernel process each), the panel's widgets read back as the browser would show them."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pytest

from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.configuration.options import options_document
from gpusession.configuration.registry import backend_names
from gpusession.core.durations import format_money
from gpusession.core.models import State
from gpusession.session import default_backend_name
from gpusession.widgets import SessionPanel, StatsView
from gpusession.widgets.card import SessionCard
from support.hosts import docker_available, product_image

DATA = Path(__file__).parent / "data"


def _text(html_value: str) -> str:
    return re.sub(r"<[^>]+>", "", html_value)


def _wait(predicate, timeout=10.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def _seconds(text: str) -> int:
    """'1m05s' -> 65 (format_duration's output)."""
    total = 0
    for value, unit in re.findall(r"(\d+)([hms])", text):
        total += int(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


@pytest.mark.integration
def test_card_shows_the_session_view_and_stop_button_stops_it(manager):
    session = manager.start(manager.make_spec("t4:2", backend="local", idle="10m", max_cost="5"))
    panel = SessionPanel(manager, [session.id])
    card = panel.cards[session.id]
    view = manager.view(manager.get(session.id))

    assert _text(card.name.value) == view["name"]
    assert (
        _text(card.state.value) == "running"
        and "gpusession-widget-state-running" in card.widget._dom_classes
    )
    assert card.kind.value == "t4 × 2 · local"  # the sidebar's words (kindText)
    assert (
        card.price.value == "$1.05/h (cloud rate, own hardware)"
    )  # the catalog's rate, this machine
    cost = card.cost.value
    assert cost.startswith(format_money(view["cost_so_far"])) and cost.endswith(" of $5.00"), cost
    assert ("(60-second minimum)" in cost) == (0 < view["billed_s"] < 60), (cost, view)
    assert abs(_seconds(card.uptime.value) - view["uptime_s"]) <= 1
    assert card.idle.value.startswith("in ") and 595 <= _seconds(card.idle.value) <= 600
    # no GPU on this machine: the agent's message, and the session's own gauges still live
    assert _text(card.stats.note.value).startswith("no NVIDIA GPU visible")
    assert card.stats.gpus == []
    assert card.stats.ram.bar.value > 0 and card.stats.ram.text.value.endswith("GiB")
    assert card.stats.widget.layout.display is None
    assert card.stop_button.layout.display is None and card.keepalive_button.layout.display is None

    pid = manager.get(session.id).resource["pid"]
    card.stop_button.click()
    record = manager.get(session.id)
    assert record.state == State.STOPPED
    assert _text(card.state.value) == "stopped"
    assert "gpusession-widget-state-stopped" in card.widget._dom_classes
    assert "gpusession-widget-state-running" not in card.widget._dom_classes
    assert (
        card.stop_button.layout.display == "none" and card.keepalive_button.layout.display == "none"
    )
    assert card.stats.widget.layout.display == "none"
    assert _text(card.message.value).startswith("stopped: ran ")
    assert _wait(
        lambda: (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
        )
    )
    panel.close()


@pytest.mark.integration
def test_keepalive_button(manager):
    session = manager.start(manager.make_spec("t4", backend="local", idle="2m"))
    panel = SessionPanel(manager, [session.id])
    card = panel.cards[session.id]
    card.keepalive_button.click()
    assert "idle stop postponed by 1h00m" in _text(card.message.value)
    panel.refresh()
    assert _seconds(card.idle.value) > 3500  # the agent's countdown now includes the hour
    panel.close()


@pytest.mark.integration
def test_live_updates_from_a_thread_end_with_the_session(manager):
    session = manager.start(manager.make_spec("t4", backend="local", idle="off"))
    panel = SessionPanel(manager, [session.id], interval=0.3).start_polling()
    card = panel.cards[session.id]
    assert card.idle.value == "off" and card.keepalive_button.layout.display == "none"
    first = card.uptime.value
    assert _wait(lambda: card.uptime.value != first, timeout=30), "uptime did not move"
    assert panel.polling
    manager.stop(session.id)  # stopped elsewhere (another notebook, the sidebar, the CLI)
    assert _wait(lambda: _text(card.state.value) == "stopped", timeout=30)
    assert _text(card.message.value).startswith(f"session {session.name} was stopped by user (ran ")
    assert _wait(lambda: not panel.polling, timeout=30), "the thread must end with the session"

    other = manager.start(manager.make_spec("t4", backend="local", idle="off"))
    panel2 = SessionPanel(manager, [other.id], interval=0.3).start_polling()
    assert panel2.polling
    panel2.close()
    assert _wait(lambda: not panel2.polling, timeout=30), "closing the widget ends the thread"
    assert manager.get(other.id).state == State.RUNNING  # closing the panel stops no session


@pytest.mark.integration
def test_a_refresh_that_saw_the_end_says_nothing_over_the_stop_buttons_result(manager):
    """The panel's refresh read the session's view (ended) while the card's own Stop finished and
    said its result; the refresh then spoke to a card already showing the end and replaced
    "stopped: ran ..." with how it ended ("... was stopped by the session panel"): a browser
    test failed on it in a loaded run. A card its own Stop ended keeps that button's words."""
    session = manager.start(manager.make_spec("t4", backend="local", idle="10m"))
    panel = SessionPanel(manager, [session.id])
    card = panel.cards[session.id]
    real_read = panel._read

    def read_while_the_button_stops(sid):
        card.stop_button.click()  # the button's whole stop, between the refresh's look and read
        return real_read(sid)

    panel._read = read_while_the_button_stops
    panel.refresh()
    assert manager.get(session.id).state == State.STOPPED
    assert _text(card.message.value).startswith("stopped: ran "), card.message.value
    panel.close()


@pytest.mark.integration
def test_watchdog_stop_shows_on_the_card(manager):
    session = manager.start(manager.make_spec("t4", backend="local", idle="2s"))
    panel = SessionPanel(manager, [session.id], interval=0.3).start_polling()
    card = panel.cards[session.id]
    # deadlines, not guesses: on a loaded machine the 2 s idle stop comes late, never wrongly
    assert _wait(lambda: _text(card.state.value) == "stopped", timeout=90)
    assert manager.get(session.id).state == State.STOPPED
    assert "was stopped by its idle watchdog after" in _text(card.message.value)
    assert _wait(lambda: not panel.polling, timeout=30)
    panel.close()


@pytest.mark.integration
def test_a_watchdog_stop_that_saved_offers_resume_on_the_card(manager):
    """The `%gpu panel` card of a session whose idle stop saved its variables says so and has
    Resume, which starts a new session on that workspace with them restored."""
    session = manager.start(manager.make_spec("t4", backend="local", idle="2s", name="pw1"))
    assert session.run("v = {'k': 5}")["status"] == "ok"
    panel = SessionPanel(manager, [session.id], interval=0.3).start_polling()
    try:
        card = panel.cards[session.id]
        assert _wait(lambda: _text(card.state.value) == "stopped", timeout=90)
        assert _wait(lambda: "saved 1 variable" in _text(card.message.value), timeout=30), (
            card.message.value
        )
        assert (
            card.resume_button.layout.display != "none"
            and card.stop_button.layout.display == "none"
        )
        card.resume_button.click()
        (new_id,) = [sid for sid in panel.cards if sid != session.id]
        assert _wait(lambda: manager.get(new_id).state == State.RUNNING, timeout=30), manager.get(
            new_id
        ).error
        assert manager.get(new_id).spec.extra["resume"] == "pw1"
        assert manager.attach(new_id).run("assert v == {'k': 5}")["status"] == "ok"
        assert panel.cards[new_id].resume_button.layout.display == "none"
    finally:
        panel.close()
        for record in manager.list(active_only=True):
            manager.stop(record.id)


@pytest.mark.integration
def test_start_form(manager, monkeypatch):
    monkeypatch.setenv("GPUSESSION_DOCKER_POOLS", '{"lab": ["ssh://gpu1"]}')  # offered for --host
    started = []
    panel = SessionPanel(manager, None, interval=0.3, on_started=started.append)
    assert panel.cards == {} and panel.empty.layout.display is None
    form = panel.form
    assert form.type_select.value == "t4"
    assert "t4 · 16 GB · $0.5260/h" in form.type_select.label
    assert set(form.backend_select.options) >= {"local", "docker", "aws"}

    # each field says what it takes, with the same placeholder as the sidebar's (GET options)
    served = {
        o["name"]: o
        for o in options_document(
            manager.config,
            catalog=manager.catalog,
            backends=backend_names(),
            backend_default=default_backend_name(manager.config),
        )["options"]
    }
    for name, widget in form.fields.items():
        if hasattr(widget, "placeholder"):
            assert widget.placeholder == served[name]["placeholder"], name
        assert html.escape(served[name]["form_help"]) in form.rows[name].children[1].value
    assert form.idle_input.placeholder == "default 30m"
    # the image field offers what the engine has; any other reference is pulled, and says so
    if docker_available():
        form.backend_select.value = "docker"
        assert form.fields["host"].options == ("pool:lab",)  # the configured pool, any host typed
        assert product_image() in form.image_input.options
        form.image_input.value = product_image()
        assert _text(form.image_note.value).startswith(f"{product_image()} · ")
        form.image_input.value = "gpusession/no-such-image:never"
        assert _text(form.image_note.value) == (
            "gpusession/no-such-image:never: not on the engine yet; "
            "the start pulls it first (that can take minutes)"
        )
        assert form.values()["image"] == "gpusession/no-such-image:never"
        form.image_input.value = ""
        form.backend_select.value = "local"
        assert form.rows["image"].layout.display == "none" and "image" not in form.values()

    # a first start's fields at once (type, backend), the rest folded under "More"
    assert (
        form.rows["type"] in form.widget.children and form.rows["idle"] not in form.widget.children
    )
    assert form.more.titles == ("More",) and form.more.selected_index is None
    assert form.rows["idle"] in form.more.children[0].children
    form.idle_input.value = "abc"
    form.start_button.click()
    assert "Idle stop: bad idle timeout 'abc'" in _text(form.message.value).replace("&#x27;", "'")
    assert form.more.selected_index == 0  # the wrong field is folded there: "More" opens
    assert manager.list() == []  # nothing recorded for bad input

    form.type_select.value = "l4"
    form.backend_select.value = "local"
    form.idle_input.value = "off"
    form.start_button.click()
    assert len(panel.cards) == 1 and panel.empty.layout.display == "none"
    card = next(iter(panel.cards.values()))
    assert _wait(lambda: started, timeout=30), _text(form.message.value)
    assert started[0].id == card.id and started[0].record.spec.gpu_type == "l4"
    assert _wait(lambda: _text(card.state.value) == "running", timeout=5)
    assert _text(form.message.value).endswith("is running")
    assert manager.get(card.id).spec.idle is None

    # following every session: one started elsewhere shows up on the next refresh
    other = manager.start(manager.make_spec("t4", backend="local", idle="off", name="elsewhere"))
    assert _wait(lambda: other.id in panel.cards, timeout=5)
    assert list(panel.card_box.children)[0] is panel.cards[other.id].widget  # newest first
    manager.stop_all()
    assert _wait(lambda: not panel.polling, timeout=5)
    panel.close()


def test_gpu_gauges_from_recorded_nvml():
    """The gauges of two T4s, from the agent's own Sampler replaying values recorded from a driver."""
    sampler = Sampler(NvmlReader(RecordedNvml.from_file(DATA / "nvml_two_t4.json")))
    sampler.sample(time.time(), kernel_busy=False)
    sampler.sample(time.time(), kernel_busy=True)
    doc = {
        "gpus_visible": sampler.gpus_visible,
        "message": sampler.message,
        "samples": sampler.samples(),
        "source": "recorded",
    }
    view = StatsView()
    view.show(doc)
    assert view.note.layout.display == "none"
    # labelled as the sidebar labels it: a "recorded" badge, which says what it means
    assert view.recorded.layout.display is None and ">recorded</span>" in view.recorded.value
    assert "not this session&#x27;s GPUs" in view.recorded.value
    assert [g.title.value for g in view.gpus] == ["GPU 0 · Tesla T4", "GPU 1 · Tesla T4"]
    gpu0 = doc["samples"][-1]["gpus"][0]
    g = view.gpus[0]
    assert g.util.bar.value == gpu0["utilization"] == 97.0 and g.util.text.value == "97%"
    assert g.util.bar.bar_style == "warning"  # at 90% or more
    assert g.memory.bar.value == pytest.approx(gpu0["memory_used"] / 1024**3)
    assert g.memory.bar.max == pytest.approx(gpu0["memory_total"] / 1024**3)
    assert g.memory.text.value == "10.2/15.0 GiB"
    assert (
        g.temp.text.value == "70 °C" and g.power.text.value == "67/70 W" and g.power.bar.max == 70.0
    )
    # an a100 session replaying the T4s: a recording of another machine, said so (issue 32 §5)
    view.show(dict(doc, recording={"gpu_name": "Tesla T4", "gpu_count": 2, "of_this_type": False}))
    assert ">recorded elsewhere</span>" in view.recorded.value
    assert "recorded on another machine (2 x Tesla T4)" in view.recorded.value
    view.show({"gpus_visible": False, "message": "no NVIDIA GPU visible (test)", "samples": []})
    assert view.gpus == [] and _text(view.note.value) == "no NVIDIA GPU visible (test)"
    assert view.recorded.layout.display == "none"  # the driver's own values: no badge


@pytest.mark.integration
def test_panel_magic_in_a_notebook_kernel(notebook):
    r = notebook.run("%gpu help")
    assert "panel [NAME | --all]" in r.text
    r = notebook.run("%gpu panel")  # no session yet: every active one (none) and the form
    assert r.status == "ok", r.text
    views = [
        c
        for _, k, c in r.outputs
        if k == "display_data" and "application/vnd.jupyter.widget-view+json" in c["data"]
    ]
    assert len(views) == 1
    r = notebook.run("%gpu start --backend local --idle off --name nb")
    assert r.status == "ok", r.text
    r = notebook.run("%gpu panel")
    assert any(k == "display_data" for _, k, _ in r.outputs), r.text
    r = notebook.run(
        "p = get_ipython()._gpusession_magics._subcommands['panel'].panel\n"
        "card = p.cards[get_ipython()._gpusession_magics.current.id]\n"
        "print(len(p.cards), card.kind.value, p.polling)"
    )
    assert r.text.split() == ["1", "t4", "×", "1", "·", "local", "True"], r.text
    r = notebook.run("card.stop_button.click(); print(get_ipython()._gpusession_magics.current)")
    assert r.text.strip() == "None", "the stop button ends the notebook's current session too"
    r = notebook.run("%gpu panel nosuch")
    assert r.status == "error" and "no session named 'nosuch'" in r.error["evalue"]


def test_card_shows_the_image_and_a_start_that_never_ran():
    """Every card names its image; a start that failed before its container ran says "never ran"
    and costs $0, not the minute minimum."""
    from gpusession.core.models import Event, LaunchSpec, SessionRecord, State
    from gpusession.session.views import session_view

    record = SessionRecord(
        id="abc",
        name="img",
        spec=LaunchSpec(gpu_type="t4", backend="docker", extra={"image": "python:3.12-slim"}),
        state=State.FAILED,
        created_at=1.0,
        updated_at=1.1,
        owner="me",
        price_per_hour=0.526,
        events=[Event("abc", State.PROVISIONING, 1.0), Event("abc", State.FAILED, 1.1)],
    )
    card = SessionCard(session_view(record), on_stop=print, on_keepalive=print)
    assert card.kind.value == "t4 × 1 · docker · python:3.12-slim"
    assert card.uptime.value == "never ran" and card.cost.value == "$0.0000"
