"""The %gpu magics in a real notebook kernel, with a real session kernel on the local backend."""

import os
import re
import time

import pytest

from gpusession.core.durations import format_money
from gpusession.core.models import State
from gpusession.session.store import Store
from support.procs import alive


def _store(nb_env) -> Store:
    return Store(os.path.join(nb_env["GPUSESSION_HOME"], "sessions.sqlite3"))


@pytest.mark.integration
def test_cells_run_in_another_process_with_live_output(notebook, nb_env):
    r = notebook.run("%gpu start --type t4 --idle off --name demo")
    assert r.status == "ok", r.text
    assert re.search(r"\[\s*\d+\.\ds\] provision", r.text), "start shows stages with elapsed time"
    assert "running: session demo is ready" in r.text

    local = notebook.run("import os; print('LOCAL', os.getpid())")
    remote = notebook.run("%%gpu\nimport os\nprint('REMOTE', os.getpid())")
    local_pid = int(local.text.split()[1])
    remote_pid = int(remote.text.split()[1])
    assert remote_pid != local_pid
    record = _store(nb_env).get("demo")
    assert record.state == State.RUNNING

    # streaming: the first print arrives long before the loop ends
    loop = notebook.run(
        "%%gpu\nimport time\nfor i in range(5):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.6)"
    )
    assert loop.status == "ok"
    first = loop.stream_times("tick 0")[0]
    total = loop.replied_at - loop.sent_at
    assert total > 2.5
    assert first < total - 1.5, f"first output at {first:.2f}s of {total:.2f}s: not streamed"
    assert [f"tick {i}" in loop.text for i in range(5)] == [True] * 5

    # rich output comes back as display data
    html = notebook.run(
        "%%gpu\nfrom IPython.display import HTML, display\ndisplay(HTML('<i>hi</i>'))\n40 + 2"
    )
    kinds = [k for _, k, _ in html.outputs]
    assert "display_data" in kinds
    assert any(
        c["data"].get("text/html") == "<i>hi</i>" for _, k, c in html.outputs if k == "display_data"
    )
    assert "42" in html.text

    stop = notebook.run("%gpu stop")
    assert "stopped demo" in stop.text
    record = _store(nb_env).get("demo")
    assert record.state == State.STOPPED
    assert not alive(remote_pid)


OUR_FRAMES = ("magics.py", "handle.py", "client.py", "cellwait.py", "gpusession")


def _plain(traceback: list[str]) -> str:
    return re.sub(r"\x1b\[[\d;]*m", "", "\n".join(traceback))


@pytest.mark.integration
def test_remote_exception_shows_the_remote_traceback(notebook):
    notebook.run("%gpu start --idle off")
    notebook.run("x = 1")  # the notebook's numbers run ahead of the session kernel's
    defined = notebook.run("%%gpu\ndef inner():\n    raise ValueError('boom from the GPU side')")
    here = defined.reply["execution_count"]
    r = notebook.run("%%gpu\ninner()")
    assert r.status == "error"
    err = r.error
    assert "boom from the GPU side" in err["evalue"]
    tb = _plain(err["traceback"])
    assert "inner()" in tb and "ValueError" in tb
    assert "kernel.py" not in tb, "no local traceback of our own code"
    # its cells are named as this notebook numbers them: where inner was defined, and the cell
    assert f"Cell In[{here}], line 2, in inner" in tb, tb
    assert f"Cell In[{r.reply['execution_count']}], line 1" in tb, tb
    # the session survives a user error
    assert "ok" in notebook.run("%%gpu\nprint('ok')").text


@pytest.mark.integration
def test_push_and_pull_round_trip(notebook):
    notebook.run("%gpu start --idle off")
    r = notebook.run("import numbers\ndata = {'a': [1, 2, 3], 'b': 'text'}\n%gpu push data")
    assert r.status == "ok", r.text
    r = notebook.run("%%gpu\ndata['a'].append(4)\nresult = (sum(data['a']), data['b'].upper())")
    assert r.status == "ok", r.text
    r = notebook.run("%gpu pull result data\nprint(result, data)")
    assert "(10, 'TEXT') {'a': [1, 2, 3, 4], 'b': 'text'}" in r.text

    bad = notebook.run("f = lambda x: x\n%gpu push f")
    assert bad.status == "error" and bad.error["ename"] == "UsageError"
    assert "cannot be pickled" in bad.error["evalue"]
    missing = notebook.run("%gpu pull nothing_here")
    assert (
        missing.error["ename"] == "UsageError"
        and "not defined in the session kernel" in missing.error["evalue"]
    )
    unpicklable = notebook.run("%%gpu\nimport threading\nlock = threading.Lock()")
    assert unpicklable.status == "ok"
    r = notebook.run("%gpu pull lock")
    assert r.error["ename"] == "UsageError" and "lock: cannot be pickled" in r.error["evalue"]


@pytest.mark.integration
def test_stop_button_interrupts_the_remote_cell(notebook):
    notebook.run("%gpu start --idle off")
    notebook.run("%%gpu\nkept = 'still here'")
    t0 = time.monotonic()
    r = notebook.run("%%gpu\nimport time\ntime.sleep(60)", interrupt_after=1.5, timeout=30)
    took = time.monotonic() - t0
    assert r.status == "error" and r.reply["ename"] == "KeyboardInterrupt"
    assert took < 8, f"interrupt took {took:.1f}s"
    # what the user sees: the remote traceback at their own line and one line of ours
    tb = _plain(r.error["traceback"])
    assert "time.sleep(60)" in tb and f"Cell In[{r.reply['execution_count']}], line 2" in tb, tb
    assert not [f for f in OUR_FRAMES if f in tb.replace("[gpusession]", "")], tb
    assert tb.splitlines()[-1].startswith("[gpusession] interrupted the cell in session"), tb
    assert len(tb.splitlines()) < 15, tb
    # `%gpu debug on` shows where in our code it was, for a bug report
    assert "debug on" in notebook.run("%gpu debug on").text
    r = notebook.run("%%gpu\nimport time\ntime.sleep(60)", interrupt_after=1.5, timeout=30)
    assert "cellwait.py" in _plain(r.error["traceback"])
    # the session kernel lives on, with its variables
    assert "still here" in notebook.run("%%gpu\nprint(kept)").text


@pytest.mark.integration
def test_gpu_on_sends_every_cell_until_off(notebook):
    notebook.run("%gpu start --idle off")
    local_pid = notebook.run("import os; print(os.getpid())").text.strip()
    assert "every cell now runs" in notebook.run("%gpu on").text
    remote_pid = notebook.run("import os; print(os.getpid())").text.strip()
    status = notebook.run("%gpu status")
    assert "every cell runs in this session" in status.text
    notebook.run("%gpu off")
    again = notebook.run("print(os.getpid())").text.strip()
    assert remote_pid != local_pid and again == local_pid


@pytest.mark.parametrize(
    "line, needle",
    [
        ("%gpu start --type t5", "unknown GPU type 't5'; valid types: t4, l4, a10g"),
        ("%gpu start --idle abc", "--idle: bad idle timeout 'abc'"),
        ("%gpu start --backend nope", "unknown backend 'nope'; valid backends:"),
        ("%gpu start --max-cost five", "--max-cost: bad max cost 'five'"),
        ("%gpu stop nosuch", "no session named 'nosuch'"),
        ("%%gpu\nprint(1)", "no GPU session in this notebook; no session is active: `%gpu start"),
        ("%gpu frobnicate", "unknown subcommand 'frobnicate'"),
        ("%gpu start --bogus", "unrecognized arguments: --bogus"),
    ],
)
@pytest.mark.integration
def test_bad_input_is_one_clear_message(notebook, nb_env, line, needle):
    r = notebook.run(line)
    assert r.status == "error"
    assert r.error["ename"] == "UsageError", r.text
    assert needle in r.error["evalue"]
    assert len(r.error["traceback"]) <= 2, "a message, not a traceback"
    assert _store(nb_env).list(active_only=True) == []


@pytest.mark.integration
def test_kernel_dying_mid_cell_is_a_clear_error_and_the_store_stays_consistent(notebook, nb_env):
    notebook.run("%gpu start --idle off --name doomed")
    pid = int(notebook.run("%%gpu\nimport os; print(os.getpid())").text)
    r = notebook.run(
        "%%gpu\nimport os, time\nprint('about to die', flush=True)\ntime.sleep(0.5)\nos._exit(1)",
        timeout=60,
    )
    assert r.status == "error" and r.error["ename"] == "UsageError"
    assert "died" in r.error["evalue"] and "doomed" in r.error["evalue"]
    record = _store(nb_env).get("doomed")
    assert record.state == State.FAILED
    assert "died" in record.error
    assert not alive(pid)
    assert not alive(record.resource["pid"])
    again = notebook.run("%%gpu\nprint(1)")
    assert again.error["ename"] == "UsageError" and "no GPU session" in again.error["evalue"]


def test_a_trailing_comment_is_no_argument():
    """The README's `%gpu start --type t4            # stages print with elapsed time` works as
    written: IPython hands line magics their whole line."""
    from gpusession.faces.magics import _without_comment

    assert (
        _without_comment("start --type t4            # stages print with elapsed time")
        == "start --type t4"
    )
    assert _without_comment("start --name run#2") == "start --name run#2"
    assert _without_comment('start --name "a # b"') == 'start --name "a # b"'
    assert _without_comment("start --name 'unclosed # x") == "start --name 'unclosed # x"


@pytest.mark.integration
def test_a_quoted_name_loses_its_quotes(notebook):
    r = notebook.run('%gpu start --idle off --name "quoted-name"')
    assert r.status == "ok", r.text
    listing = notebook.run("%gpu list").text
    assert "quoted-name" in listing and '"quoted-name"' not in listing, listing
    notebook.run("%gpu stop")


@pytest.mark.integration
def test_ctrl_c_during_start_is_one_line_and_leaves_nothing(notebook, nb_env, manager):
    try:
        _ctrl_c_during_start(notebook, nb_env)
    finally:  # a run whose Ctrl-C came too late (a loaded machine) leaves no session behind
        manager.stop_all(by="the test's cleanup")


def _ctrl_c_during_start(notebook, nb_env) -> None:
    store = _store(nb_env)

    def starting() -> bool:  # the start is under way: its record is there, not yet running
        return any(
            r.name == "cut-short" and r.state.value in ("provisioning", "starting")
            for r in store.list()
        )

    r = notebook.run("%gpu start --idle off --name cut-short", interrupt_when=starting, timeout=60)
    assert r.status == "error", r.text
    assert r.error["ename"] == "UsageError", r.error
    assert (
        "start of cut-short interrupted" in r.error["evalue"]
        and "nothing is left running" in r.error["evalue"]
    )
    assert len(r.error.get("traceback") or []) <= 2, r.error[
        "traceback"
    ]  # one line, not a traceback
    rec = _store(nb_env).get("cut-short")
    assert rec.state.value == "failed" and "interrupted" in (rec.error or "")
    # a name stays with its record, a failed one's too: the retry is told a free one
    again = notebook.run("%gpu start --idle off --name cut-short")
    assert again.status == "error" and "such as cut-short-2" in again.error["evalue"], again.text
    assert notebook.run("%gpu start --idle off --name cut-short-2").status == "ok"
    notebook.run("%gpu stop")


@pytest.mark.integration
def test_gpu_use_makes_the_sidebar_name_this_notebooks_kernel(notebook, manager):
    """A notebook that took up a session with `%gpu use` has it in its status bar: the
    sidebar's view lists that notebook's kernel among the session's (with when it took it)."""
    from gpusession.server.sidebar_state import StartProgress, panel_view

    other = manager.start(manager.make_spec("t4", backend="local", idle="off", name="shared-one"))
    pid = int(notebook.run("import os; print(os.getpid())").text.split()[-1])
    before = time.time()
    r = notebook.run("%gpu use shared-one")
    assert "using shared-one" in r.text, r.text
    view = panel_view(manager, manager.get(other.id), StartProgress(), {pid: "k-notebook"})
    assert view["kernel_id"] is None  # it did not start it
    assert set(view["kernels"]) == {"k-notebook"} and view["kernels"]["k-notebook"] >= before


@pytest.mark.integration
def test_a_second_start_says_the_first_session_still_bills_and_how_to_stop_it(notebook, nb_env):
    """Issue 32 §1: a second `%gpu start` in a notebook leaves the first session running: it
    says so, with its rate and the stop command, and that command stops it."""
    assert notebook.run("%gpu start --idle off --name first-one").status == "ok"
    second = notebook.run("%gpu start --idle off --name second-one")
    assert second.status == "ok", second.text
    (line,) = [x for x in second.text.splitlines() if x.startswith("note: first-one")]
    price = _store(nb_env).get("first-one").price_per_hour
    assert f"is still running and billing {format_money(price)}/h" in line, line
    assert "`%gpu stop first-one` stops it" in line, line
    assert "stopped first-one" in notebook.run("%gpu stop first-one").text
    third = notebook.run("%gpu status")
    assert "second-one" in third.text, "the notebook moved to the new session"
    notebook.run("%gpu stop")
    assert _store(nb_env).list(active_only=True) == []


@pytest.mark.integration
def test_a_cell_after_a_stop_elsewhere_names_the_sessions_still_active(notebook, manager):
    """The next %%gpu after the sidebar stopped this notebook's session says who stopped it and,
    while another session runs, names it and `%gpu use NAME` (as when the notifier found the end
    first), not only "`%gpu start` a new one"."""
    assert notebook.run("%gpu start --idle off --name keep-one").status == "ok"
    assert notebook.run("%gpu start --idle off --name nb-gone").status == "ok"
    manager.stop("nb-gone", by="the JupyterLab sidebar")
    cell = notebook.run("%%gpu\n1 + 1")
    said = cell.text + str(cell.error)
    assert cell.status == "error", said
    assert "session nb-gone was stopped by the JupyterLab sidebar" in said, said
    assert "active now: keep-one (running): `%gpu use NAME`" in said, said
    assert "`%gpu start` a new one" not in said, said
    notebook.run("%gpu stop keep-one")
    alone = notebook.run("%%gpu\n1 + 1")  # none active now: how to start one
    said = alone.text + str(alone.error)
    assert alone.status == "error" and "no session is active: `%gpu start` starts one" in said
