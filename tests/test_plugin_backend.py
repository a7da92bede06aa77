"""A backend registered through the entry-point group by a package of its own (no edit in
gpusession): its start option shows on every face - `%gpu help start`, `gpusession start
--help`, REST `GET options` (what the sidebar's form is built from) and the %gpu panel's form."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpusession.configuration import options

DATA = Path(__file__).parent / "data" / "plugin_backend"
REPO = Path(__file__).resolve().parent.parent


def install_plugin(where: Path) -> Path:
    """The package and its dist-info (entry_points.txt), as `pip install` would leave them."""
    shutil.copytree(DATA / "gpusession_demo_backend", where / "gpusession_demo_backend")
    info = where / "gpusession_demo_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gpusession-demo-backend\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[gpusession.backends]\ndemo = gpusession_demo_backend:DemoBackend\n"
    )
    return where


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    path = install_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(path))
    yield path


def run_python(code: str, path: Path, home: Path) -> str:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(path), str(REPO)]), GPUSESSION_HOME=str(home)
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_table_gathers_the_plugins_option(plugin_path):
    row = options.table().by_name["demo_zone"]
    assert row.backends == ("demo",) and row.flag == "--demo-zone"


@pytest.mark.integration
def test_cli_and_magic_help_show_it(plugin_path, tmp_path):
    cli = run_python(
        "from gpusession.faces.cli import main; main(['start', '--help'])", plugin_path, tmp_path
    )
    assert "--demo-zone" in cli and "demo: the zone its machines are in" in cli
    magic = run_python(
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'gpusession')\n"
        "ip.run_line_magic('gpu', 'help start')\n",
        plugin_path,
        tmp_path,
    )
    assert "--demo-zone" in magic and "demo: the zone its machines are in" in magic


async def test_rest_options_document_has_it(plugin_path, jp_fetch):
    import json

    r = await jp_fetch("gpusession", "api", "options")
    doc = json.loads(r.body)
    row = next(o for o in doc["options"] if o["name"] == "demo_zone")
    assert row["backends"] == ["demo"] and row["form"] is True and row["label"] == "Demo zone"
    assert "demo" in next(o for o in doc["options"] if o["name"] == "backend")["choices"]


def test_the_panel_form_has_it(plugin_path, manager):
    from gpusession.widgets.panel import StartForm

    form = StartForm(manager, lambda values: None)
    assert "demo_zone" in form.fields
    spec = manager.make_spec("t4", backend="demo", demo_zone="eu-1")
    assert spec.backend == "demo" and spec.extra["demo_zone"] == "eu-1"


# -- its setting and its price list, on every face (issue 31: a backend is a whole plugin) -----


@pytest.mark.integration
def test_its_setting_reaches_the_cli_the_magic_and_the_configuration_reference(
    plugin_path, tmp_path
):
    """c.DemoBackend.zone: the CLI reads its env var (the start's default for --demo-zone, said
    in the record), `%config DemoBackend.zone` works in a notebook, and the generated
    configuration reference lists it with its env var."""
    env_zone = run_python(
        "import os; os.environ['GPUSESSION_DEMO_ZONE'] = 'env-zone'\n"
        "from gpusession.session import SessionManager\n"
        "from gpusession.configuration.settings import EnvConfig\n"
        "m = SessionManager(EnvConfig())\n"
        "print(m.make_spec('t4', backend='demo').extra['demo_zone'])\n",
        plugin_path,
        tmp_path,
    )
    assert env_zone.strip() == "env-zone"
    magic = run_python(
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'gpusession')\n"
        "ip.run_line_magic('config', 'DemoBackend.zone = \"cfg-zone\"')\n"
        "m = ip._gpusession_magics.manager\n"
        "print('ZONE', m.make_spec('t4', backend='demo').extra['demo_zone'])\n"
        "print('GIVEN', m.make_spec('t4', backend='demo', demo_zone='mine').extra['demo_zone'])\n",
        plugin_path,
        tmp_path,
    )
    assert "ZONE cfg-zone" in magic and "GIVEN mine" in magic, magic
    reference = run_python(
        f"import sys; sys.path.insert(0, {str(REPO / 'scripts')!r})\n"
        "import gen_docs\nprint(gen_docs.configuration_page())\n",
        plugin_path,
        tmp_path,
    )
    assert "| `c.DemoBackend.zone` | `GPUSESSION_DEMO_ZONE` |" in reference, reference


@pytest.mark.integration
def test_its_price_list_shows_on_the_cli_the_magic_and_a_sessions_record(plugin_path, tmp_path):
    """The demo backend prices its GPUs itself: `gpusession types` and `%gpu types` show its
    list under the catalog, a session recorded on it carries that price, and its price note
    says where the price comes from."""
    types = run_python(
        "from gpusession.faces.cli import main; main(['types'])", plugin_path, tmp_path
    )
    assert "demo (the demo price list): t4 $0.1100, a100 $1.25 per GPU-hour" in types, types
    magic = run_python(
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'gpusession')\n"
        "ip.run_line_magic('gpu', 'types')\n",
        plugin_path,
        tmp_path,
    )
    assert "demo (the demo price list): t4 $0.1100" in magic, magic
    listed = run_python(
        "from gpusession.session import SessionManager\n"
        "m = SessionManager()\n"
        "r = m.create(m.make_spec('a100:2', backend='demo'))\n"
        "from gpusession.words.status import session_table\n"
        "print(session_table([m.view(r)]))\n",
        plugin_path,
        tmp_path,
    )
    assert "2.500 (its backend's price list)" in listed, listed


async def test_rest_catalog_and_options_carry_its_price_list_and_setting(
    plugin_path, jp_fetch, monkeypatch
):
    """What the sidebar's form reads: GET catalog has its price list (the form shows it for the
    chosen type), GET options the --demo-zone default its setting gives."""
    import json

    monkeypatch.setenv("GPUSESSION_DEMO_ZONE", "rest-zone")
    catalog = json.loads((await jp_fetch("gpusession", "api", "catalog")).body)
    (demo,) = [row for row in catalog["backend_prices"] if row["backend"] == "demo"]
    assert demo == {
        "backend": "demo",
        "source": "the demo price list",
        "prices": {"t4": 0.11, "a100": 1.25},
    }
    doc = json.loads((await jp_fetch("gpusession", "api", "options")).body)
    row = next(o for o in doc["options"] if o["name"] == "demo_zone")
    assert row["default"] == "rest-zone"


def test_the_panel_form_shows_its_price(plugin_path, manager):
    from gpusession.widgets.panel import StartForm

    form = StartForm(manager, lambda values: None)
    form.backend_select.value = "demo"
    form.type_select.value = "a100"
    assert "$1.25/h per GPU (the demo price list)" in form.own_price_note.value
    form.backend_select.value = "local"
    assert form.own_price_note.value == ""
