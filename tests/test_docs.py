"""The docs cannot drift: the generated references match their tables, the site builds with
warnings as errors (broken links included), and the README stays a doorway whose links work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_generated_references_match_their_tables():
    done = subprocess.run(
        [sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.integration
def test_the_docs_site_builds_without_a_warning(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "docs", str(tmp_path / "html")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "html" / "reference" / "options.html").exists()


def test_readme_is_a_doorway_whose_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme) < 8000, f"README.md is {len(readme)} characters: move references into docs/"
    for command in ("./scripts/demo.sh", "./scripts/test.sh"):
        assert command in readme
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not missing, missing
