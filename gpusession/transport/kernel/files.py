"""Which local files an upload sends: the paths named, a folder with what is below it, without
`.git` and what the folder's `.gitignore` files ignore (git's own rules, read by `pathspec`), and
a size cap for the folder a session starts with (`--upload`, `--upload-max`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable

from ...configuration import options
from ...core.errors import BadInput

DEFAULT_CAP = 100_000_000  # bytes: the start option's tree, unless --upload-max says otherwise


@dataclasses.dataclass
class Tree:
    files: list[tuple[str, str]]  # (local path, name in the session, '/'-separated)
    size: int  # bytes of file content


def _ignored(specs: list[tuple[str, object]], rel: str, is_dir: bool) -> bool:
    """Does any .gitignore above `rel` (a '/' path below the folder) ignore it?"""
    for base, spec in specs:
        if base and not (rel + "/").startswith(base + "/"):
            continue
        below = rel[len(base) + 1 :] if base else rel
        if spec.match_file(below + ("/" if is_dir else "")):  # type: ignore[attr-defined]
            return True
    return False


def _walk(root: str, prefix: str, everything: bool, tree: Tree) -> None:
    import pathspec

    specs: list[tuple[str, object]] = []
    for top, dirs, names in os.walk(root, followlinks=False):
        rel_top = os.path.relpath(top, root).replace(os.sep, "/")
        rel_top = "" if rel_top == "." else rel_top
        if not everything and ".gitignore" in names:
            with open(os.path.join(top, ".gitignore"), encoding="utf-8", errors="replace") as f:
                specs.append((rel_top, pathspec.GitIgnoreSpec.from_lines(f)))

        def rel(name: str) -> str:
            return f"{rel_top}/{name}" if rel_top else name

        if not everything:
            dirs[:] = [d for d in dirs if d != ".git" and not _ignored(specs, rel(d), True)]
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(top, name)
            if not os.path.isfile(full) or os.path.islink(full):
                continue  # links and sockets stay here: only plain files go
            if not everything and (name == ".git" or _ignored(specs, rel(name), False)):
                continue
            tree.files.append((full, f"{prefix}{rel(name)}"))
            tree.size += os.path.getsize(full)


def collect(paths: Iterable[str], *, everything: bool = False, contents: bool = False) -> Tree:
    """The files to send for `paths`. A folder goes as itself (`data/x.csv`), or with
    `contents` as what is in it (`x.csv`: a working directory brought into the session's)."""
    tree = Tree([], 0)
    for path in paths:
        full = os.path.abspath(os.path.expanduser(path))
        if not os.path.exists(full):
            raise BadInput(f"no such file or folder here: {path!r}")
        if os.path.isdir(full):
            name = os.path.basename(full.rstrip(os.sep))
            _walk(full, "" if contents else f"{name}/", everything, tree)
        else:
            tree.files.append((full, os.path.basename(full)))
            tree.size += os.path.getsize(full)
    return tree


def start_tree(folder: str, cap: int | None, cap_field: str = "--upload-max") -> Tree:
    """The working directory a session starts with; BadInput when it is over `cap` bytes."""
    if not os.path.isdir(folder):
        raise BadInput(f"{folder!r}: no such folder here")
    tree = collect([folder], contents=True)
    cap = DEFAULT_CAP if cap is None else cap
    if tree.size > cap:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..pulls import format_bytes

        raise BadInput(
            f"{folder!r} is {format_bytes(tree.size)} in {len(tree.files)} files (without .git and what "
            f".gitignore ignores), over the {format_bytes(cap)} cap; raise it with {cap_field} "
            f"(e.g. {format_bytes(tree.size * 2).replace(' ', '')}), or ignore big files in .gitignore"
        )
    return tree


def upload_start_tree(kc, extra: dict, progress) -> None:
    """--upload: the folder's files (its .git and what .gitignore ignores left out) into the
    session kernel's working directory, so that `import utils` works in the first cell."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..pulls import format_bytes
    from . import transfer_client

    if not extra.get("upload"):
        return
    with progress.stage("upload", f"{extra['upload']} into the session's working directory"):
        tree = start_tree(extra["upload"], extra.get("upload_max"))
        progress.step(f"{len(tree.files)} files, {format_bytes(tree.size)}")
        took = progress.elapsed()
        done = transfer_client.upload(kc, tree.files, tree.size, ".", None)
        took = max(progress.elapsed() - took, 1e-6)
        progress.step(
            f"{done['files']} files in {done['dest']} ({format_bytes(tree.size / took)}/s)"
        )


def check_start_tree(extra: dict, face: str = options.FLAGS) -> None:
    """BadOptions (naming the field in the words of `face`) when the --upload folder is missing
    or over its cap."""
    if extra.get("upload"):
        try:
            start_tree(
                extra["upload"],
                extra.get("upload_max"),
                options.table().by_name["upload_max"].field(face),
            )
        except BadInput as exc:
            raise options.BadOptions({"upload": str(exc)}, face) from None
