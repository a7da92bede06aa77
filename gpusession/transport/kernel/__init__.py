"""Talking to the session kernel with jupyter_client: execute with live output, interrupt, move
variables, shut down.

Output is re-published into the notebook as it arrives (stream text is written and flushed piece
by piece, display data goes through IPython's display publisher), so a loop's prints show before
the loop ends; through a tunnel that drops, every output still arrives exactly once and in order,
or one line names exactly which did not (`cellwait`).

The kernel client (`client.KernelClient`: jupyter_client, zmq) and the output sinks (`sink`) are
imported from their modules; this package imports nothing, so `files`, say, needs neither.
"""
