"""A backend as a third party would ship it: one package, registered through the
`gpusession.backends` entry-point group (tests/test_plugin_backend.py writes its dist-info), with
one start option of its own. Nothing in gpusession names it."""

from gpusession.backends.base import Backend
from gpusession.configuration.options import StartOption


class DemoBackend(Backend):
    name = "demo"
    start_options = (
        StartOption(
            "demo_zone",
            ("--demo-zone",),
            "text",
            "Demo zone",
            "demo: the zone its machines are in",
            "demo zone",
            form=True,
            max_len=40,
        ),
    )

    def provision(self, record, progress):
        raise NotImplementedError("a demo backend starts nothing")

    def connect(self, record, progress):
        raise NotImplementedError

    def is_alive(self, record):
        return False

    def stop(self, record):
        pass

    def list_resources(self):
        return []

    def remove_resource(self, resource):
        pass
