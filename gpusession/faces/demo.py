"""`gpusession demo`: run the quickstart notebook headless and show what it did."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..session import SessionManager
from ..words.status import timeline
from ..words.stops import summary_line

NOTEBOOK_NAME = "quickstart.ipynb"


def find_quickstart() -> Path:
    """The notebook shipped in the wheel, else the one in a source checkout."""
    here = Path(__file__).resolve().parent.parent  # the gpusession package
    for candidate in (
        here / "notebooks" / NOTEBOOK_NAME,
        here.parent / "notebooks" / NOTEBOOK_NAME,
    ):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{NOTEBOOK_NAME} is not installed; pass --notebook PATH")


def execute_notebook(
    path: str | os.PathLike[str],
    *,
    env: dict[str, str] | None = None,
    timeout: int = 300,
    allow_errors: bool = False,
    cwd: str | None = None,
):
    """Execute a notebook in a fresh python3 kernel; returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=timeout,
        allow_errors=allow_errors,
        resources={"metadata": {"path": cwd or str(Path(path).parent)}},
    )
    if env is not None:
        client.km = client.create_kernel_manager()
        old = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            client.execute()
        finally:
            os.environ.clear()
            os.environ.update(old)
    else:
        client.execute()
    return nb


def output_text(cell) -> str:
    """The text a person would read under a cell."""
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out["text"])
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            parts.append(data.get("text/plain", "") + ("\n" if data.get("text/plain") else ""))
            if "text/html" in data:
                parts.append(f"[html] {data['text/html']}\n")
        elif kind == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n")
    return "".join(parts)


def run_demo(notebook: str | None = None, backend: str = "local", out: str | None = None) -> int:
    path = Path(notebook) if notebook else find_quickstart()
    os.environ["GPUSESSION_BACKEND"] = backend
    started = time.time()
    print(f"running {path} headless on the '{backend}' backend ...", flush=True)
    nb = execute_notebook(path, env=dict(os.environ), timeout=600)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        print(f"\n[{i}] {first}" + (" ..." if "\n" in cell.source.strip() else ""))
        text = output_text(cell).rstrip()
        if text:
            print("    " + text.replace("\n", "\n    "))
    if out:
        import nbformat

        nbformat.write(nb, out)
        print(f"\nexecuted notebook saved to {out}")
    manager = SessionManager()
    ran = [r for r in manager.list() if r.created_at >= started - 1]
    for r in ran:
        print(
            f"\nsession {r.name} ({r.backend}, {r.spec.gpu_count} x {r.spec.gpu_type}): {r.state.value}, "
            f"{summary_line(r)}"
        )
        print(timeline(r))
    print(f"\ndemo finished in {time.time() - started:.1f}s")
    return 0
