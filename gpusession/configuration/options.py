"""THE table of start options: the core's rows (`CORE_OPTIONS`) and each registered backend's own (its class's
`start_options`, gathered through the entry points: gpusession/configuration/registry.py), with each row's `backends` filled from
the class that declares it. Every face is built from `OPTIONS`, and nothing else declares a start option: the
`%gpu start` magic and `gpusession start` (`add_arguments`), the REST body of `POST sessions` and
`POST options/check` (`body_problems`, `check_body`), the JupyterLab form (`GET options`: `options_document`) and
the `%gpu panel` form (the rows with `form=True`). `build_spec` turns what any face collected into a `LaunchSpec`.

Values come in as the user wrote them ("15m", "$5", "a100:8", true) and one parser per kind reads them, so a value
means the same on every face. A key that is absent (or "default") takes its default; None means none: no limit for
a duration or an amount, the default where an option cannot be none (type, backend). Problems are data
(`BadOptions.problems`: field -> what was wrong); a face names the field in its own words when it shows them (REST:
'idle', magic and CLI: --idle, forms: the label).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import re
import sys
from typing import Any, Callable, Iterable, Mapping

from ..core import textvalues
from ..core.durations import (
    IDLE,
    MAX_RUNTIME,
    SAVE_TIMEOUT,
    DurationRule,
    exact_decimal,
    format_bound,
    parse_money,
    shown,
)
from ..core.errors import BadInput
from ..core.models import LaunchSpec
from ..core.protocol import DEFAULT_IDLE_S
from . import advice, metrics, registry
from .agentargs import DEFAULT_SAVE_CAP, DEFAULT_SAVE_TIMEOUT_S
from .settings import default_host_for, setting_value

# How a face names a field in messages.
REST = "rest"  # 'idle'        (REST bodies; also the keyword of SessionManager.make_spec)
FLAGS = "flags"  # --idle      (%gpu start, gpusession start)
FORM = "form"  # Idle stop     (the forms' labels)

#: how a value is written and read; the lab form picks its input from this
KINDS = ("gpu_type", "backend", "duration", "money", "bool", "text", "choice", "gpus")

# JSON types a REST body may use for each kind (None is always allowed: see the module doc)
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "gpu_type": ((str,), "a string"),
    "backend": ((str,), "a string"),
    "text": ((str,), "a string"),
    "choice": ((str,), "a string"),
    "duration": ((str, int, float), "a string or a number"),
    "money": ((str, int, float), "a string or a number"),
    "gpus": ((str, int), "a string or a whole number"),
    "bool": ((bool,), "true or false"),
}
_JSON_NAMES = {
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}
_METAVARS = {
    "gpu_type": "TYPE[:N]",
    "backend": "NAME",
    "duration": "DURATION",
    "money": "DOLLARS",
    "gpus": "N|shared|all|device=IDS",
}
MAX_GPUS = 1024
TYPES = "types"  # spec.extra: a fallback list's types in the order tried, "l4:1"
# one device of --gpus device=...: an index, or a GPU-/MIG- UUID
_DEVICE_ID = re.compile(r"\d{1,4}|(?:GPU|MIG)-[0-9A-Za-z-]{1,80}")
#: start options `switch` does not take: its new session resumes the old one's workspace
SWITCH_SKIP = ("workspace", "resume")
#: `switch --on-demand`: the one switch flag that is no start option
ON_DEMAND_HELP = "the new session is not spot (its old one was): the switch's opposite of --spot"
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StartOption:
    """One start option, as every face shows it."""

    name: str  # the REST field; the flag is --name with '-' for '_'
    flags: tuple[str, ...]  # argparse flags, the long one first: ("--type", "-t")
    kind: str  # one of KINDS: how the value is written and read
    label: str  # the field's title in a form, and its name in a form's messages
    help: str  # units, the default, what 'off' means; --help and the forms show it
    what: str  # the value in messages: "bad idle timeout 'abc'"
    default: str | bool | None = None  # as a user would type it; None: not set
    config_default: str | None = None  # the GpuSessionConfig trait that supplies the default
    setting: str | None = None  # a backend's row: its own setting (`settings`) that supplies it
    backends: tuple[str, ...] | None = None  # the backends it applies to; None: all
    choices: tuple[str, ...] | None = None  # the values of a 'choice'
    spec_field: str | None = None  # the LaunchSpec field it fills; None: spec.extra[name]
    form: bool = False  # shown in the start forms (sidebar, %gpu panel)
    rule: DurationRule | None = None  # a duration's bound and whether it may be off
    max_len: int = 40  # the longest text accepted (checked before anything reads it)
    reader: Callable[[str], Any] | None = None  # a text's grammar (gpusession/core/textvalues.py)
    capability: str | None = (
        None  # a core row for the backends whose class has this flag (Backend.takes_host...)
    )
    hint: str | None = None  # an empty form field's text: the value's shape and unit (placeholder)
    first: bool = False  # a first start needs it: shown at once in a form (the rest under "More")

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        assert self.flags[0] == "--" + self.name.replace("_", "-"), self.flags
        assert (self.kind == "duration") == (self.rule is not None), self.name

    @property
    def flag(self) -> str:
        return self.flags[0]

    def field(self, face: str) -> str:
        """The option's name in a message of `face`."""
        return {REST: f"'{self.name}'", FLAGS: self.flag, FORM: self.label}[face]


CORE_OPTIONS: tuple[StartOption, ...] = (  # every backend's; a backend's own are on its class
    StartOption(
        "type",
        ("--type", "-t"),
        "gpu_type",
        "GPU type",
        "GPU type, optionally with a count: t4, a100:8; or a fallback list tried in order "
        "until one has capacity: l4,a10g,t4 (by price with --cheapest) "
        "(see %gpu types; default t4, or GpuSessionConfig.default_type)",
        "GPU type",
        config_default="default_type",
        spec_field="gpu_type",
        form=True,
        first=True,
    ),
    StartOption(
        "backend",
        ("--backend", "-b"),
        "backend",
        "Backend",
        "where the session runs",  # + the registered backends and the default rule (_gathered)
        "backend",
        config_default="default_backend",
        spec_field="backend",
        form=True,
        first=True,
    ),
    StartOption(
        "name",
        ("--name", "-n"),
        "text",
        "Name",
        "session name: letters, digits, '-', '_', '.' (default: TYPE-N)",
        "name",
        spec_field="name",
        form=True,
        hint="letters, digits, - _ .",
        max_len=textvalues.MAX_NAME,
        reader=textvalues.session_name,
    ),
    StartOption(
        "host",
        ("--host",),
        "text",
        "Host",
        "the machine it runs on",  # + each capable backend's `host_help` (_gathered)
        "host",
        capability="takes_host",
        form=True,
        hint="ssh://user@host[:port]",
        max_len=400,
        reader=textvalues.host_or_pool,
    ),
    StartOption(
        "image",
        ("--image",),
        "text",
        "Image",
        "container image with a python3",  # + each capable backend's `image_help` (_gathered)
        "image",
        capability="takes_image",
        form=True,
        hint="repo:tag, e.g. python:3.12-slim",
        max_len=512,
        reader=textvalues.image_ref,
    ),
    StartOption(
        "idle",
        ("--idle",),
        "duration",
        "Idle stop",
        "stop after this long idle: 90s, 15m, 1h30m, a bare "
        f"number of minutes, or off (or 0: never); 2s to 7 days (default {format_bound(DEFAULT_IDLE_S)}, or "
        "GpuSessionConfig.default_idle)",
        "idle timeout",
        config_default="default_idle",
        spec_field="idle",
        form=True,
        hint="90s, 15m, 1h30m, off",
        rule=IDLE,
    ),
    StartOption(
        "gpu_only",
        ("--gpu-only",),
        "bool",
        "GPU-only idle",
        "count only GPU utilization as activity (stops a busy kernel whose GPU sits unused)",
        "GPU-only idle",
        default=False,
        spec_field="gpu_only",
    ),
    StartOption(
        "max_runtime",
        ("--max-runtime",),
        "duration",
        "Max runtime",
        "hard stop after this long, e.g. 8h "
        "(a bare number means minutes); 2s to 30 days (default: off)",
        "max runtime",
        spec_field="max_runtime",
        rule=MAX_RUNTIME,
    ),
    StartOption(
        "max_cost",
        ("--max-cost",),
        "money",
        "Max cost ($)",
        "stop when the session has cost this many "
        "dollars, e.g. 5; warning at 80%; at most $100,000 (default: off)",
        "max cost",
        spec_field="max_cost",
        form=True,
        hint="dollars, e.g. 5",
    ),
    StartOption(
        "workspace",
        ("--workspace",),
        "text",
        "Workspace",
        "the session's working folder, kept after it stops where its backend keeps workspaces "
        "(`gpusession workspaces` lists them; default: one named after the session)",
        "workspace",
        capability="keeps_workspaces",
        max_len=textvalues.MAX_NAME,
        reader=textvalues.workspace_name,
        form=True,
        hint="a name",
    ),
    StartOption(
        "resume",
        ("--resume",),
        "text",
        "Resume",
        "start on this workspace and restore the variables its last "
        "session saved (see `gpusession workspaces`)",
        "workspace to resume",
        capability="keeps_workspaces",
        max_len=textvalues.MAX_NAME,
        reader=textvalues.workspace_name,
        form=True,
        hint="a saved workspace",
    ),
    StartOption(
        "save_timeout",
        ("--save-timeout",),
        "duration",
        "Save time bound",
        "an idle, cost or runtime stop first "
        "saves the kernel's variables into the workspace, for at most this long (default "
        f"{exact_decimal(DEFAULT_SAVE_TIMEOUT_S)}s; off: no save)",
        "save time bound",
        capability="keeps_workspaces",
        rule=SAVE_TIMEOUT,
    ),
    StartOption(
        "recover",
        ("--recover",),
        "choice",
        "Recover",
        "when the capacity is taken back (a spot interruption, a cluster's time limit or "
        "preemption) after the state was saved, the notebook starts a replacement that restores "
        "it and runs the next cell there (auto: on for --spot sessions and for a Slurm job preempted by another)",
        "recover",
        default="auto",
        choices=("auto", "on", "off"),
        capability="keeps_workspaces",
    ),
    StartOption(
        "save_cap",
        ("--save-cap",),
        "text",
        "Save cap per variable",
        "a variable larger than this (pickled) is not saved, e.g. 500MB, 2GiB, off (default "
        f"{DEFAULT_SAVE_CAP // 1024**3}GiB)",
        "save cap",
        capability="keeps_workspaces",
        reader=textvalues.size_or_off,
    ),
    StartOption(
        "upload",
        ("--upload",),
        "text",
        "Upload folder",
        "a folder here whose files the session starts "
        "with, in its working directory (without .git and what .gitignore ignores), e.g. . for this "
        "notebook's folder: `import utils` then works in %%gpu cells",
        "upload folder",
        max_len=400,
        reader=textvalues.local_folder,
    ),
    StartOption(
        "upload_max",
        ("--upload-max",),
        "text",
        "Upload cap",
        "the largest --upload folder: 500MB, 2GB (default 100MB)",
        "upload cap",
        max_len=20,
        reader=textvalues.byte_size,
    ),
    StartOption(
        "gpu_mem",
        ("--gpu-mem",),
        "text",
        "GPU memory",
        "at least this much memory per GPU, e.g. 24G: every catalog type with that much, "
        "cheapest first, tried in turn until one has capacity (with a --type list: the ones "
        "of it with that much, in its order)",
        "GPU memory",
        hint="24G",
        form=True,
        max_len=16,
        reader=textvalues.gpu_memory,
    ),
)


@dataclasses.dataclass(frozen=True)
class OptionTable:
    """The one option table: the core's rows, then each registered backend's (in listing
    order), with `backends` filled from the classes that declare or are capable of them."""

    options: tuple[StartOption, ...]
    by_name: dict[str, StartOption]
    names: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def _gathered(path: tuple[str, ...]) -> OptionTable:
    classes = (
        registry.loaded_classes()
    )  # imports each backend (the table is needed by a start, a form, --help)
    ordered = [
        name
        for _, name in sorted((getattr(cls, "order", 100), name) for name, cls in classes.items())
    ]
    rows = {o.name: o for o in CORE_OPTIONS}
    for o in CORE_OPTIONS:
        if o.capability is not None:
            capable = tuple(n for n in ordered if getattr(classes[n], o.capability, False))
            rows[o.name] = dataclasses.replace(
                o, backends=capable, help=_with_backends_help(o, capable, classes)
            )
    rows["backend"] = dataclasses.replace(
        rows["backend"], help=_backend_help(rows["backend"].help, ordered, classes)
    )
    for name in ordered:
        for o in getattr(classes[name], "start_options", ()):
            known = rows.get(o.name)
            if known is None:
                rows[o.name] = dataclasses.replace(o, backends=(name,))
            elif known.backends is not None and o.name not in _CORE_NAMES:
                if _same_meaning(known, o):  # declared by two backends: one row, both helps
                    rows[o.name] = dataclasses.replace(
                        known, backends=(*known.backends, name), help=f"{known.help}; {o.help}"
                    )
                else:
                    log.warning(
                        "backend %r declares the start option %r unlike %s does (its flags, kind, "
                        "default or reader differ): left out",
                        name,
                        o.name,
                        ", ".join(known.backends),
                    )
            else:
                log.warning(
                    "backend %r declares the start option %r, which the core has: left out",
                    name,
                    o.name,
                )
    options = tuple(rows.values())
    return OptionTable(options, rows, tuple(rows))


_CORE_NAMES = frozenset(o.name for o in CORE_OPTIONS)
#: what two backends declaring one start option must agree on (the contract of a shared row):
#: everything a user types and reads alike on every face; `help` is each one's own, joined, and
#: speaks only for its backend ("kubernetes: what a new workspace's claim requests, default 10")
_SHARED_FIELDS = tuple(
    f.name for f in dataclasses.fields(StartOption) if f.name not in ("help", "backends", "setting")
)


def _same_meaning(first: StartOption, second: StartOption) -> bool:
    return all(getattr(first, f) == getattr(second, f) for f in _SHARED_FIELDS)


def _with_backends_help(option: StartOption, capable: tuple[str, ...], classes) -> str:
    """A capability row's help with what each backend that has it says of it (its class's
    `<option>_help`, e.g. `host_help`): 'the machine it runs on: docker: a remote engine, ...'."""
    said = [
        f"{name}: {text}"
        for name in capable
        if (text := getattr(classes[name], f"{option.name}_help", ""))
    ]
    return f"{option.help} ({'; '.join(said)})" if said else option.help


def _backend_help(text: str, ordered: list[str], classes) -> str:
    """The backend row's help: the backends installed here, and how the default is chosen."""
    tried = registry.default_order(classes)
    if len(tried) > 2:
        rule = f"the first that answers of {', '.join(tried[:-1])}, else {tried[-1]}"
    elif len(tried) == 2:
        rule = f"{tried[0]} when it answers, else {tried[1]}"
    else:
        rule = tried[0] if tried else "none"
    return f"{text}: {', '.join(ordered)} (default: {rule}, or GpuSessionConfig.default_backend)"


def table() -> OptionTable:
    """The option table of the backends installed on this import path (gathered once per path)."""
    return _gathered(tuple(sys.path))


_LEGACY = {"gpu_only_idle": "gpu_only"}  # keywords earlier callers of make_spec used


class BadOptions(BadInput):
    """Start options that cannot be used. `problems`: field -> what is wrong with it (fields
    that are no option included); the message names each field in the words of `face`."""

    def __init__(self, problems: Mapping[str, str], face: str = REST):
        self.problems = dict(problems)
        self.face = face
        super().__init__(self.worded(face))

    def worded(self, face: str) -> str:
        t = table()
        unknown = [field_shown(name) for name in self.problems if name not in t.by_name]
        parts = []
        if unknown:
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            names = (
                ", ".join(
                    unknown[:5]
                    if face == REST
                    else (f"--{n.replace('_', '-')}" for n in unknown[:5])
                )
                + more
            )
            every = list(t.names if face == REST else (o.flag for o in t.options))
            parts.append(f"unknown field(s) {names}; allowed: {allowed_list(every)}")
        parts += [
            f"{t.by_name[n].field(face)}: {p}" for n, p in self.problems.items() if n in t.by_name
        ]
        return "; ".join(parts)


# -- the faces' inputs -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, skip: Iterable[str] = ()) -> None:
    """Add every start option (but those named in `skip`) to an argparse parser (the magic's and
    the CLI's `start` and `kernelspec install`). An option not given is None in the namespace;
    `given_values` drops those."""
    for o in table().options:
        if o.name in skip:
            continue
        text = o.help.replace("%", "%%")
        if o.kind == "bool":
            parser.add_argument(*o.flags, dest=o.name, action="store_true", default=None, help=text)
        else:
            metavar = (
                "{" + ",".join(o.choices) + "}"
                if o.choices
                else _METAVARS.get(o.kind, o.name.upper())
            )
            parser.add_argument(*o.flags, dest=o.name, default=None, metavar=metavar, help=text)


def given_values(source: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """The start options a parsed command line (or a form) gave, by name; the rest are left out,
    so they take their defaults."""
    items = vars(source) if isinstance(source, argparse.Namespace) else source
    return {name: items[name] for name in table().names if items.get(name) is not None}


def allowed_list(every: list[str]) -> str:
    """The allowed fields in one short line: the first ones, and where the rest are listed."""
    more = f" and {len(every) - 24} more (`%gpu help start`)" if len(every) > 24 else ""
    return ", ".join(every[:24]) + more


def body_problems(body: Mapping[str, Any]) -> dict[str, str]:
    """What is wrong with a REST body before its values are read: fields that are no option,
    and values of the wrong JSON type. Cheap; needs nothing but the body."""
    problems: dict[str, str] = {}
    t = table()
    for key, value in body.items():
        option = t.by_name.get(key)
        if option is None:
            problems[field_shown(key)] = f"unknown field; allowed: {allowed_list(list(t.names))}"
            continue
        types, expected = _JSON_TYPES[option.kind]
        if value is not None and (
            not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        ):
            got = _JSON_NAMES.get(type(value), type(value).__name__)
            problems[key] = f"wrong type ({got}): expected {expected}"
    return problems


def check_body(
    body: Mapping[str, Any], *, catalog, backends: Iterable[str] | None = None
) -> dict[str, str]:
    """Every problem of a REST body, by field (empty when it is good): `body_problems`, then the
    values as the table reads them. What `POST options/check` answers; no backend is asked."""
    problems = body_problems(body)
    _, value_problems = _read(
        {k: v for k, v in body.items() if k not in problems}, catalog, backends
    )
    problems.update(value_problems)
    return problems


def parse_values(
    values: Mapping[str, Any], *, catalog, backends: Iterable[str] | None = None, face: str = REST
) -> dict[str, Any]:
    """The given options read by the table: name -> value (seconds, dollars, ("a100", 8), ...).
    Raises BadOptions naming every bad field in the words of `face`."""
    parsed, problems = _read(values, catalog, backends)
    if problems:
        raise BadOptions(problems, face)
    return parsed


def _read(
    values: Mapping[str, Any], catalog, backends: Iterable[str] | None
) -> tuple[dict[str, Any], dict[str, str]]:
    parsed: dict[str, Any] = {}
    problems: dict[str, str] = {}
    known = sorted(backends) if backends is not None else None
    for option in table().options:  # in the table's order, so every face lists problems alike
        value = values.get(option.name)
        if isinstance(value, str) and len(value) > option.max_len:  # before anything reads it
            problems[option.name] = (
                f"{option.what} is {len(value):,} characters long; at most {option.max_len}"
            )
            continue
        if option.name not in values or _not_given(option, value):
            continue
        try:
            parsed[option.name] = _parse_one(option, value, catalog, known)
        except BadInput as exc:
            problems[option.name] = str(exc)
    return parsed, problems


def given_names(values: Mapping[str, Any]) -> set[str]:
    """The options a face was given a value for (not blank, not "default")."""
    by_name = table().by_name
    values = {_LEGACY.get(k, k): v for k, v in values.items()}
    return {k for k, v in values.items() if k in by_name and not _not_given(by_name[k], v)}


def _not_given(option: StartOption, value: Any) -> bool:
    """A blank string, or "default" for an option with a configured default."""
    return isinstance(value, str) and (
        not value.strip() or (value.strip() == "default" and option.config_default is not None)
    )


def _parse_one(option: StartOption, value: Any, catalog, backends: list[str] | None) -> Any:
    """One value, as its kind reads it; None for none."""
    kind, what = option.kind, option.what
    if value is None:
        return None
    if kind == "duration":
        return option.rule.parse(value)  # type: ignore[union-attr]
    if kind == "money":
        return parse_money(value, what=what)
    if kind == "bool":
        if not isinstance(value, bool):
            raise BadInput(f"{what} is on or off (true or false), got {shown(value)}")
        return value
    if kind == "gpus":
        return _gpus(value)
    if not isinstance(value, str):
        raise BadInput(f"{what} must be text, got {shown(value)}")
    text = value.strip()
    if kind == "gpu_type":
        if "," in text:  # a fallback list: l4,a10g:2,t4
            return [_one_type(catalog, part) for part in text.split(",")]
        return _one_type(catalog, text)
    if not text:
        return None
    if kind == "backend":
        text = text.lower()
        if backends is not None and text not in backends:
            raise BadInput(f"unknown backend {shown(value)}; valid backends: {', '.join(backends)}")
        return text
    if kind == "choice":
        text = text.lower()
        if text not in (option.choices or ()):
            raise BadInput(f"{what} {shown(value)}: use one of {', '.join(option.choices or ())}")
        return text
    return option.reader(text) if option.reader is not None else text


def _one_type(catalog, text: str) -> tuple[str, int]:
    gpu, count = catalog.parse(text.strip())  # BadInput names the valid types
    return gpu.name, count


def type_choices(
    value: tuple[str, int] | list[tuple[str, int]],
    *,
    catalog,
    gpu_mem: int | None = None,
    given: bool = True,
    by_price: bool = False,
    spot: bool = False,
    backend: str | None = None,
) -> list[tuple[str, int]]:
    """The types a start tries, in order: --type's one or its list (`given`: written by the
    user, not the default), kept to those with `gpu_mem` GiB or more; with --gpu-mem and no
    --type, every catalog type with that much, cheapest first; `by_price` (--cheapest): the
    cheapest first by `backend`'s rates (`Backend.gpu_rate`; `spot`: its typical spot rate),
    those it cannot give last. BadInput when none is left."""
    chosen = list(value) if isinstance(value, list) else [value]
    if gpu_mem is not None:
        if not given:
            chosen = [(t.name, chosen[0][1]) for t in catalog.whole_types()]
            by_price = True
        chosen = [(n, c) for n, c in chosen if catalog.get(n).memory_gb >= gpu_mem]
        if not chosen:
            raise BadInput(
                f"no GPU type {'of --type ' if given else ''}has {gpu_mem} GiB or more; "
                "see %gpu types (or gpusession types) for each type's memory"
            )
    if by_price:
        rate = advice.rater(catalog, backend, spot)

        def price(choice: tuple[str, int]) -> tuple[bool, float]:
            found = rate(catalog.get(choice[0]), choice[1])
            return found is None, found or 0.0

        chosen.sort(key=price)
    return list(dict.fromkeys(chosen))


def field_shown(name: str) -> str:
    """A field name from a body, cut short: a megabyte key is not echoed back."""
    return name if len(name) <= 40 else name[:37] + "..."


def _gpus(value: Any) -> str | int:
    """'all', 'shared', a count, or device=IDS (indices, GPU-/MIG- UUIDs)."""
    if isinstance(value, str) and value.strip().lower() in ("all", "shared"):
        return value.strip().lower()
    text = str(value).strip()
    if isinstance(value, str) and text.lower().startswith("device="):
        ids = [d.strip() for d in text[len("device=") :].split(",")]
        if ids and all(_DEVICE_ID.fullmatch(d) for d in ids):
            return "device=" + ",".join(ids)
    elif not isinstance(value, bool) and text.isdigit() and 1 <= int(text) <= MAX_GPUS:
        return int(text)
    raise BadInput(
        f"GPU request {shown(value)}: write a whole number from 1 to {MAX_GPUS}, 'shared', "
        "'all', or device= with indices or UUIDs (device=0,1 or device=MIG-...)"
    )


# -- what the faces make of them ---------------------------------------------------------------


def build_spec(
    values: Mapping[str, Any],
    *,
    config,
    catalog,
    backend_default: str | Callable[[], str],
    backends: Iterable[str] | None = None,
    face: str = REST,
) -> LaunchSpec:
    """A LaunchSpec from start options as written (a face's values, or make_spec's keywords).

    config: GpuSessionConfig (default_type, default_idle); catalog: the GPU catalog;
    backend_default: the backend when none is named, or a function that finds it (it may ask
    the Docker engine, so it is called only then); backends: the installed backend names, to
    check the name against (None: not checked here). Keys that are no option go to
    `spec.extra` unchanged (backend-specific settings of Python callers, e.g. boot_timeout).
    Raises BadOptions naming every bad field in the words of `face`."""
    by_name = table().by_name
    values = {_LEGACY.get(k, k): v for k, v in values.items()}
    raw = {k: v for k, v in values.items() if not (k in by_name and _not_given(by_name[k], v))}
    type_given = raw.get("type") is not None
    if not type_given:
        raw["type"] = config.default_type
    if raw.get("backend") is None:
        raw["backend"] = backend_default() if callable(backend_default) else backend_default
        _default_place(raw, by_name)
    if "idle" not in raw:  # None stays: no idle stop
        raw["idle"] = config.default_idle
    for name, value in _setting_defaults(config, raw["backend"]).items():
        raw.setdefault(name, value)  # a backend's own settings, where it was not given
    parsed = parse_values(raw, catalog=catalog, backends=backends, face=face)
    try:
        choices = type_choices(
            parsed.pop("type"),
            catalog=catalog,
            gpu_mem=parsed.get("gpu_mem"),
            given=type_given,
            by_price=bool(parsed.get("cheapest")),
            spot=bool(parsed.get("cheapest") or parsed.get("spot")),
            backend=parsed.get("backend"),
        )
    except BadInput as exc:
        raise BadOptions({"gpu_mem" if "gpu_mem" in parsed else "type": str(exc)}, face) from None
    gpu_name, count = choices[0]
    backend, idle = parsed.pop("backend"), parsed.pop("idle")
    spec = LaunchSpec(gpu_type=gpu_name, gpu_count=count, backend=backend, idle=idle)
    for name, value in parsed.items():
        option = by_name[name]
        if option.spec_field is not None:
            if value is not None or option.kind in ("duration", "money"):
                setattr(spec, option.spec_field, value)
        elif value is not None or option.kind == "duration":  # a duration's None: off, as given
            spec.extra[name] = value
    spec.extra.update({k: v for k, v in values.items() if k not in by_name and v is not None})
    if len(choices) > 1:  # the fallback list (session/fallback.py tries it)
        spec.extra[TYPES] = [f"{n}:{c}" for n, c in choices]
    return spec


def _default_place(raw: dict[str, Any], by_name: Mapping[str, StartOption]) -> None:
    """The backend was not named: the default place's --host goes with it (`gpusession setup`'s
    choice, or GPUSESSION_HOST), unless a --host was given."""
    host = by_name.get("host")
    if raw.get("host") or host is None or raw["backend"] not in (host.backends or ()):
        return
    found = default_host_for(str(raw["backend"]))
    if found:
        raw["host"] = found


#: what an empty field of a kind shows when its row has no hint of its own
_HINTS = {
    "duration": "15m, 2h, off",
    "money": "dollars, e.g. 5",
    "gpus": "a number, shared, all",
    "text": "optional",
}
#: what an empty field means, for the rows whose default is no value (both forms show it)
_EMPTY_MEANS = {
    "name": "TYPE-N",
    "host": "this machine",
    "image": "the backend's",
    "workspace": "the session's name",
}


def placeholder(option: StartOption, default: Any = None) -> str:
    """An empty field's text in both start forms (the sidebar's and `%gpu panel`'s), short enough
    for a 250 px sidebar: its default ('default 30m', 'default this machine'), else the value's
    shape ('dollars, e.g. 5'); the shape is in the help under the field too (`form_help`)."""
    hint = option.hint or _HINTS.get(option.kind, "")
    if default not in (None, "", False):
        empty = str(default)
    elif option.name in _EMPTY_MEANS:
        empty = _EMPTY_MEANS[option.name]
    else:
        empty = "off" if option.kind in ("duration", "money") else None
    return f"default {empty}" if empty else hint


_CONFIG_WORDS = re.compile(r",? or GpuSessionConfig\.\w+")


def form_help(option: StartOption) -> str:
    """The help a form shows under a field, in the user's words: what the value is and its shape,
    without the config's trait names (the field's default already says the configured one)."""
    return _CONFIG_WORDS.sub("", option.help)


def form_defaults(config, backend_default: str) -> dict[str, Any]:
    """The defaults a form shows, as a user would type them (the config applied): the rows'
    GpuSessionConfig traits, and each backend's own settings for its rows."""
    found: dict[str, Any] = {
        o.name: getattr(config, o.config_default)
        for o in table().options
        if o.config_default and o.name != "backend"
    }
    found["backend"] = backend_default
    if default_host_for(backend_default):
        found["host"] = default_host_for(backend_default)
    for o in table().options:
        if o.setting and o.backends:
            found.update(_setting_defaults(config, o.backends[0], only=o.name))
    return found


def _setting_defaults(config, backend: Any, only: str | None = None) -> dict[str, Any]:
    """The values `backend`'s own settings give its rows that name one (StartOption.setting), as
    written; empty ones left out."""
    out: dict[str, Any] = {}
    for o in table().options:
        if not o.setting or (only and o.name != only):
            continue
        if not isinstance(backend, str) or o.backends is None or backend not in o.backends:
            continue
        cls = registry.load_backend_class(backend)
        value = setting_value(cls.__name__, cls.settings, o.setting, config)
        if value not in (None, ""):
            out[o.name] = value
    return out


def options_document(
    config, *, catalog, backends: Iterable[str], backend_default: str
) -> dict[str, Any]:
    """`GET options`: every option with its default as the user would type it (config applied),
    the installed backends and the catalog's types as choices. Format (the lab form reads it):
    {"options": [{"name", "flag", "kind", "label", "help", "default", "backends", "choices", "form",
    "placeholder"}], "metrics": [metric_rows]}"""
    defaults = form_defaults(config, backend_default)
    choices = {"backend": list(backends), "gpu_type": list(catalog.names())}
    return {
        "metrics": metrics.metric_rows(),
        "options": [
            {
                "name": o.name,
                "flag": o.flag,
                "kind": o.kind,
                "label": o.label,
                "help": o.help,
                "default": defaults.get(o.name, o.default),
                "backends": list(o.backends) if o.backends is not None else None,
                "choices": choices.get(o.kind, list(o.choices) if o.choices is not None else None),
                "form": o.form,
                "placeholder": placeholder(o, defaults.get(o.name, o.default)),
                "form_help": form_help(o),
                "first": o.first,
            }
            for o in table().options
        ],
    }
