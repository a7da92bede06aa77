"""The one table of start options drives every face: the %gpu start magic, `gpusession start`, the
REST body check, the options document and the %gpu panel form list the same options, read a
value the same way, and name a bad field in their own words."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from gpusession.configuration import options
from gpusession.configuration.catalog import load_catalog
from gpusession.configuration.config import GpuSessionConfig
from gpusession.core.durations import QUEUE_TIMEOUT
from gpusession.core.models import LaunchSpec
from gpusession.faces import cli
from gpusession.faces.magics import GpuMagics, _start_args

BACKENDS = ["aws", "docker", "local"]


def start_subparser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["start"]


def dests(parser: argparse.ArgumentParser) -> list[str]:
    return [a.dest for a in parser._actions if a.dest != "help"]


def spec_from(values: dict, face: str) -> LaunchSpec:
    return options.build_spec(
        values,
        config=GpuSessionConfig(),
        catalog=load_catalog(),
        backend_default="local",
        backends=BACKENDS,
        face=face,
    )


# -- one list of options ---------------------------------------------------------------------


def test_every_face_lists_the_same_options():
    names = list(options.table().names)
    assert (
        len(names) == len(set(names)) == 42
    )  # the built-in backends' rows: kubernetes adds --context, --namespace and --storage-class
    assert dests(_start_args.parser) == names
    assert dests(start_subparser()) == names
    assert options.body_problems({name: None for name in names}) == {}
    unknown = options.check_body({"colour": "red"}, catalog=load_catalog())["colour"]
    assert unknown == f"unknown field; allowed: {options.allowed_list(names)}"
    assert unknown.startswith(f"unknown field; allowed: {', '.join(names[:24])} and ")
    doc = options.options_document(
        GpuSessionConfig(), catalog=load_catalog(), backends=BACKENDS, backend_default="local"
    )
    assert [o["name"] for o in doc["options"]] == names


def test_a_row_two_backends_declare_shows_each_ones_words_and_one_unlike_is_left_out(
    monkeypatch, caplog
):
    """The contract of a shared row: two backends that declare one option alike (flags, kind,
    default, reader) make one row whose help is each one's words; one that declares it otherwise
    is left out with a warning, never a row that reads a value two ways."""
    from gpusession.configuration import registry

    real = registry.loaded_classes()
    kube = real["kubernetes"].start_options
    size = next(o for o in kube if o.name == "workspace_size")

    class Alike:
        order = 90
        start_options = (dataclasses.replace(size, help="alike: its own words (default 7)"),)

    class Unlike:
        order = 91
        start_options = (dataclasses.replace(size, kind="duration", rule=QUEUE_TIMEOUT),)

    monkeypatch.setattr(
        registry, "loaded_classes", lambda: {**real, "alike": Alike, "unlike": Unlike}
    )
    row = options._gathered(("a path of its own",)).by_name["workspace_size"]
    assert row.backends == ("aws", "kubernetes", "alike")
    assert row.help.split("; ") == [
        "aws: a new workspace's gp3 volume in GiB (default 50)",
        "kubernetes: what a new workspace's claim requests, in GiB (default 10)",
        "alike: its own words (default 7)",
    ]
    assert "'unlike' declares the start option 'workspace_size' unlike" in caplog.text
    # each backend's help speaks for itself: a shared row's words never name another backend
    for name, cls in real.items():
        for o in getattr(cls, "start_options", ()):
            others = [n for n in real if n != name and re.search(rf"\b{n}\b", o.help)]
            assert not others, (name, o.name, others)


def test_flags_are_the_names_and_short_flags_stay():
    for o in options.table().options:
        assert o.flag == "--" + o.name.replace("_", "-")
    parsed = parse_argstring(_start_args, "-t a100:8 -n big -b local")
    assert (parsed.type, parsed.name, parsed.backend) == ("a100:8", "big", "local")
    parsed = start_subparser().parse_args(["-t", "a100:8", "-n", "big", "-b", "local"])
    assert (parsed.type, parsed.name, parsed.backend) == ("a100:8", "big", "local")


def test_the_magic_help_lists_every_flag(capsys):
    GpuMagics(None)._help("start")
    out = " ".join(capsys.readouterr().out.split())
    for o in options.table().options:
        assert o.flag in out
    assert "a bare number of minutes" in out and "2s to 7 days" in out


@pytest.mark.parametrize("sub", ["start", "stop", "use", "watch", "keepalive", "upload", "push"])
def test_subcommand_help_names_what_the_user_types(sub, capsys):
    GpuMagics(None)._help(sub)
    usage = capsys.readouterr().out.split("\n\n")[1]  # after IPython's '::'
    assert usage.strip().startswith(f"%gpu {sub}") and "_args" not in usage, usage


def test_the_form_shows_the_options_marked_for_forms(manager):
    from gpusession.widgets.panel import StartForm

    form = StartForm(manager, lambda values: None)
    assert list(form.fields) == [o.name for o in options.table().options if o.form]
    assert list(form.fields) == [
        "type",
        "backend",
        "name",
        "host",
        "image",
        "idle",
        "max_cost",
        "workspace",
        "resume",
        "gpu_mem",
        "spot",
        "cheapest",
    ]
    # a workspace and --resume apply where a workspace outlives the session: shown and sent only there
    form.backend_select.value = "local"
    form.fields["resume"].value = " rw1 "
    assert form.values()["resume"] == "rw1" and form.rows["resume"].layout.display != "none"
    form.backend_select.value = "aws"  # an EBS volume
    assert form.values()["resume"] == "rw1" and form.rows["resume"].layout.display != "none"
    form.backend_select.value = (
        "slurm"  # a folder on the cluster (every built-in backend keeps one)
    )
    assert form.values()["resume"] == "rw1" and form.rows["resume"].layout.display != "none"


# -- one value, read alike on every face -------------------------------------------------------

CASES = [
    # (magic/CLI words, REST body, what the spec holds)
    (["--idle", "1h30m"], {"idle": "1h30m"}, {"idle": 5400.0}),
    (["--idle", "90"], {"idle": 90}, {"idle": 5400.0}),  # a bare number means minutes
    (["--idle", "off"], {"idle": "off"}, {"idle": None}),
    (["--max-runtime", "278h"], {"max_runtime": "278h"}, {"max_runtime": 278 * 3600.0}),
    (["--max-cost", "$5"], {"max_cost": 5}, {"max_cost": 5.0}),
    (["--gpu-only"], {"gpu_only": True}, {"gpu_only": True}),
    (
        ["--spot", "--region", "us-west-2"],
        {"spot": True, "region": "us-west-2"},
        {"extra": {"spot": True, "region": "us-west-2"}},  # aws's own options
    ),
    (["-t", "a100:4"], {"type": "a100:4"}, {"gpu_type": "a100", "gpu_count": 4}),
    (["--gpus", "2"], {"gpus": 2}, {"extra": {"gpus": 2}}),
    (
        ["--fallback", "On-Demand", "--max-price", "1.5"],
        {"fallback": "on-demand", "max_price": "1.5"},
        {"extra": {"fallback": "on-demand", "max_price": 1.5}},
    ),
    (
        ["--name", "big", "--host", "ssh://me@box", "--image", "my/img"],
        {"name": "big", "host": "ssh://me@box", "image": "my/img"},
        {"name": "big", "extra": {"host": "ssh://me@box", "image": "my/img"}},
    ),
]


@pytest.mark.parametrize("words, body, expected", CASES)
def test_a_value_reads_the_same_through_every_face(words, body, expected):
    magic = options.given_values(parse_argstring(_start_args, " ".join(words)))
    command = options.given_values(start_subparser().parse_args(words))
    assert options.check_body(body, catalog=load_catalog(), backends=BACKENDS) == {}
    specs = [
        spec_from(magic, options.FLAGS),
        spec_from(command, options.FLAGS),
        spec_from(body, options.REST),
    ]
    assert specs[0] == specs[1] == specs[2]
    for key, value in expected.items():
        assert getattr(specs[0], key) == value


def test_the_faces_hand_the_values_over_as_given(manager):
    """A face gives the manager what the user gave, says which face it is, and the table does the
    rest: the defaults, the reading, the messages in the face's words. No face takes `type`,
    `backend` or `idle` out first, and no "default" string stands for a value not given."""
    bad = {"type": "l4", "backend": "local", "idle": "abc", "max_cost": "lots"}
    said = {}
    for face in (options.REST, options.FLAGS, options.FORM):
        with pytest.raises(options.BadOptions) as exc:
            manager.spec_from(bad, face)
        said[face] = str(exc.value)
    why = (
        "bad idle timeout 'abc': write e.g. 90s, 15m, 1h30m (a bare number means minutes) or 'off'",
        "bad max cost 'lots': write dollars, e.g. 5 or 2.50",
    )
    assert said == {
        options.REST: f"'idle': {why[0]}; 'max_cost': {why[1]}",
        options.FLAGS: f"--idle: {why[0]}; --max-cost: {why[1]}",
        options.FORM: f"Idle stop: {why[0]}; Max cost ($): {why[1]}",
    }
    plain = manager.spec_from({"backend": "local"}, options.FORM)
    assert (plain.gpu_type, plain.idle) == (
        "t4",
        1800.0,
    )  # left out: the config's defaults
    assert (
        manager.spec_from({"backend": "local", "idle": None}, options.REST).idle is None
    )  # none: no idle stop
    assert manager.make_spec("l4", backend="local", idle="1h30m") == manager.spec_from(
        {"type": "l4", "backend": "local", "idle": "1h30m"}, options.FLAGS
    )
    pkg = Path(options.__file__).parent.parent  # the gpusession package
    faces = [
        "faces/cli.py",
        "faces/magics.py",
        "server/handlers.py",
        "server/api.py",
        "provisioner/provisioner.py",
        "widgets/panel.py",
    ]
    taken = [
        f"{face}: {m.group(0)}"
        for face in faces
        for m in re.finditer(
            r'pop\("(type|backend|idle)"[^)]*\)|"default"\)', (pkg / face).read_text()
        )
    ]
    assert not taken, taken
    assert all((pkg / face).is_file() for face in faces), faces


def test_the_form_reads_like_the_other_faces(manager):
    from gpusession.widgets.panel import StartForm

    form = StartForm(manager, lambda values: None)
    form.type_select.value = "l4"
    form.backend_select.value = "local"
    form.idle_input.value = " 90 "
    form.fields["max_cost"].value = "$5"
    form.fields["host"].value = "ssh://me@box"  # a docker option: left out while local is chosen
    assert form.rows["spot"].layout.display == "none"  # aws only: hidden
    values = form.values()
    assert "host" not in values and "spot" not in values
    expected = spec_from(
        options.given_values(parse_argstring(_start_args, "-t l4 -b local --idle 90 --max-cost 5")),
        options.FLAGS,
    )
    assert spec_from(values, options.FORM) == expected
    form.backend_select.value = "docker"
    assert form.rows["host"].layout.display is None and form.values()["host"] == "ssh://me@box"


# -- defaults ------------------------------------------------------------------------------------


def test_defaults_come_from_the_config_and_none_means_none():
    config = GpuSessionConfig(default_type="l4:2", default_idle="10m")

    def build(values: dict) -> LaunchSpec:
        return options.build_spec(
            values, config=config, catalog=load_catalog(), backend_default=lambda: "local"
        )

    spec = build({})
    assert (spec.gpu_type, spec.gpu_count, spec.backend, spec.idle) == (
        "l4",
        2,
        "local",
        600.0,
    )
    assert build({"idle": "default", "type": "default", "backend": ""}) == spec
    assert build({"idle": None}).idle is None  # make_spec(idle=None): no idle stop
    assert build({"type": None, "backend": None}) == spec
    # what make_spec's Python callers pass besides the table goes to extra, as it always did
    assert build({"boot_timeout": 3, "subnet": None}).extra == {"boot_timeout": 3}
    assert build({"gpu_only_idle": True}).gpu_only is True


def test_the_backend_default_is_only_looked_for_when_needed():
    def never() -> str:
        raise AssertionError("asked for the default backend")

    spec = options.build_spec(
        {"backend": "Local"},
        config=GpuSessionConfig(),
        catalog=load_catalog(),
        backend_default=never,
    )
    assert spec.backend == "local"


def test_options_document():
    config = GpuSessionConfig(default_type="a10g", default_idle="45m")
    doc = options.options_document(
        config, catalog=load_catalog(), backends=["docker", "local"], backend_default="docker"
    )
    by_name = {o["name"]: o for o in doc["options"]}
    assert set(doc) == {"options", "metrics"}
    for o in doc["options"]:
        assert set(o) == {
            "name",
            "flag",
            "kind",
            "label",
            "help",
            "default",
            "backends",
            "choices",
            "form",
            "placeholder",
            "form_help",
            "first",
        }
    assert by_name["type"]["default"] == "a10g" and "h200" in by_name["type"]["choices"]
    assert by_name["backend"] == dict(
        by_name["backend"], default="docker", choices=["docker", "local"], kind="backend"
    )
    assert by_name["idle"] == {
        "name": "idle",
        "flag": "--idle",
        "kind": "duration",
        "label": "Idle stop",
        "help": by_name["idle"]["help"],
        "default": "45m",
        "backends": None,
        "choices": None,
        "form": True,
        "placeholder": "default 45m",
        "form_help": by_name["idle"]["form_help"],
        "first": False,
    }
    # a form's words are the user's: no config names, and placeholders that fit 250 px
    assert [o["name"] for o in doc["options"] if o["first"]] == ["type", "backend"]
    for o in doc["options"]:
        assert "GpuSessionConfig" not in o["form_help"], o
        assert len(o["placeholder"]) <= 28, o
    assert "GpuSessionConfig.default_type" in by_name["type"]["help"]  # --help keeps it
    assert by_name["host"]["placeholder"] == "default this machine"
    assert by_name["max_cost"]["placeholder"] == "default off"
    assert by_name["spot"]["default"] is False and by_name["spot"]["backends"] == ["aws"]
    assert (
        by_name["fallback"]["choices"] == ["off", "zone", "on-demand", "any"]
        and by_name["fallback"]["default"] == "off"
    )
    assert by_name["max_cost"]["default"] is None and by_name["max_cost"]["kind"] == "money"


# -- a bad value, said in each face's words -------------------------------------------------------


def test_rest_names_the_field_as_in_the_body():
    problems = options.check_body(
        {"idle": "abc", "spot": "yes", "max_cost": 1e999, "gpus": 0, "colour": 1},
        catalog=load_catalog(),
        backends=BACKENDS,
    )
    assert problems == {
        "colour": f"unknown field; allowed: {options.allowed_list(list(options.table().names))}",
        "spot": "wrong type (string): expected true or false",
        "idle": "bad idle timeout 'abc': write e.g. 90s, 15m, 1h30m (a bare number means minutes) or 'off'",
        "max_cost": "max cost must be a finite number, got inf",
        "gpus": "GPU request 0: write a whole number from 1 to 1024, 'shared', 'all', or device= "
        "with indices or UUIDs (device=0,1 or device=MIG-...)",
    }
    message = str(options.BadOptions(problems, options.REST))
    assert message.startswith("unknown field(s) colour; allowed: type, backend,")
    assert "'spot': wrong type (string)" in message and "'idle': bad idle timeout 'abc'" in message


@pytest.mark.parametrize(
    "words, needle",
    [
        ("--idle abc", "--idle: bad idle timeout 'abc'"),
        ("--idle 8d", "--idle: idle timeout must be at most 7d"),
        ("--max-runtime inf", "--max-runtime: max runtime must be a finite number"),
        ("--max-cost five", "--max-cost: bad max cost 'five'"),
        ("--max-price 1e999", "--max-price: max price must be a finite number"),
        ("--type t5", "--type: unknown GPU type 't5'"),
        (
            "-b nope",
            "--backend: unknown backend 'nope'; valid backends: aws, docker, kubernetes, local",
        ),
        ("--fallback never", "--fallback: fallback 'never': use one of off, zone, on-demand, any"),
        ("--gpus some", "--gpus: GPU request 'some'"),
    ],
)
def test_the_magic_and_the_cli_name_the_flag(words, needle, manager, capsys, monkeypatch):
    magics = GpuMagics(None, manager=manager)
    with pytest.raises(UsageError) as e:
        magics.gpu("start -b local " + words if not words.startswith("-b") else "start " + words)
    assert needle in str(e.value)
    argv = (
        ["start", "-b", "local", *words.split()]
        if not words.startswith("-b")
        else ["start", *words.split()]
    )
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpusession start: ") and needle in err[0]
    assert manager.list() == [], "bad input records nothing"


def test_the_form_names_the_field_by_its_label(manager):
    from gpusession.widgets.panel import SessionPanel

    panel = SessionPanel(manager, [], interval=60)
    try:
        panel.form.backend_select.value = "local"
        panel.form.idle_input.value = "abc"
        panel.form.fields["max_cost"].value = "-2"
        panel.form.start_button.click()
        text = panel.form.message.value.replace("&#x27;", "'")
        assert (
            "Idle stop: bad idle timeout 'abc'" in text
            and "Max cost ($): max cost must be positive" in text
        )
        assert manager.list() == []
    finally:
        panel.close()


# -- LaunchSpec ----------------------------------------------------------------------------------


def test_launch_spec_reads_the_legacy_gpu_only_idle_key_of_old_store_rows():
    old = {"gpu_type": "t4", "backend": "docker", "gpu_only_idle": True, "idle_timeout_s": 600.0}
    spec = LaunchSpec.from_dict(old)
    assert spec.gpu_only is True and spec.idle == 600.0
    assert "gpu_only_idle" not in spec.to_dict() and spec.to_dict()["gpu_only"] is True
    assert LaunchSpec.from_dict(spec.to_dict()) == spec
    assert old["gpu_only_idle"] is True, "the row itself is left as it was"
