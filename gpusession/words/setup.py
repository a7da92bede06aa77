"""`gpusession setup` in words: the table of the places where GPUs were looked for, and the line
a choice ends with."""

from __future__ import annotations

from typing import Any

LOOKING = "looking for GPUs: this machine, Docker engines, ~/.ssh/config, AWS, Slurm, kubeconfig"


def places_table(places: list[Any]) -> str:
    """One row a place: its number (for --choose), what, where, GPUs, backend, and a note.

    #  found            where                          GPUs                  backend  note
    1  docker engine    unix:///var/run/docker.sock    none                  docker   answers, but ..."""
    rows = [("#", "found", "where", "GPUs", "backend", "note")]
    for n, p in enumerate(places, 1):
        mark = str(n) if p.usable else f"({n})"
        rows.append((mark, p.kind, p.where, p.gpus, p.backend or "-", p.note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def setup_summary(places: list[Any], command: str = "gpusession setup --choose N --yes") -> str:
    """What the table means and how to choose (`command`: the CLI's, or `%gpu setup --choose N`)."""
    usable = [n for n, p in enumerate(places, 1) if p.usable]
    if not usable:
        return (
            "no place here can give a GPU session yet (numbers in brackets: found, but no GPU or "
            f"no answer); name one with `{command}` to use it anyway"
        )
    return f"{len(usable)} place(s) can give a GPU session: `{command}` makes one your default"


def chosen_line(place: Any, path: str) -> str:
    """'your default is now docker on ssh://gpu1 (a start with no --backend goes there), written
    to ~/.config/gpusession/settings.json'."""
    on = f" on {place.host}" if place.host else ""
    return (
        f"your default is now {place.backend}{on} (a start with no --backend goes there), "
        f"written to {path}"
    )
