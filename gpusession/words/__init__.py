"""Every sentence, number and table a user reads is made here, from data.

The magics, the CLI, the widgets, the REST API and the kernel provisioner call these modules, so
the notebook, the terminal, the ipywidgets card and the sidebar show the same numbers the same
way. A layer of its own between the session core and the faces: it imports no face, nothing below
the faces imports it, and nothing parses what it returns. One module a job:

- common: how GPUs and GPU kernels are named, price notes, GPU memory and sizes, "never ran"
- status: the sessions table, `status` (heading, GPU and host lines, sparklines), the timeline,
  a session view with its words for REST (rest_view)
- stops: stop reasons, the ended message and summary, warnings, idle and keepalive, an
  interrupted cell, gc's lines, errors as a face shows them
- spend: advice, the spend report, the budget, policy bounds, live prices, the catalog's refresh
- workspaces: checkpoint and restore lines, the workspaces table and its REST view, transfers
- switches: a switch's line, a notebook that follows its session, recovery, a cut switch

This package re-exports nothing: import from the module that holds what you use.
"""
