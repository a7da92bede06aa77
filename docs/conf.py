# Sphinx configuration: the docs are Markdown (MyST). Build: sphinx-build -W -b html docs docs/_build
project = "gpusession"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4  # links such as benchmarks.md#data-between-the-notebook-and-a-session
html_theme = "alabaster"
