"""A backend as a third party would ship it: one package, registered through the
`gpusession.backends` entry-point group (tests/test_plugin_backend.py writes its dist-info), with
a start option, a setting and a price list of its own. Nothing in gpusession names it."""

from gpusession.backends.base import Backend
from gpusession.configuration.options import StartOption
from gpusession.configuration.settings import Setting


class DemoBackend(Backend):
    name = "demo"
    # its own setting: c.DemoBackend.zone (config files, %config), else GPUSESSION_DEMO_ZONE
    settings = (
        Setting(
            "zone",
            "GPUSESSION_DEMO_ZONE",
            "",
            "demo: the zone its machines are in when --demo-zone names none. Empty means none.",
        ),
    )
    start_options = (
        StartOption(
            "demo_zone",
            ("--demo-zone",),
            "text",
            "Demo zone",
            "demo: the zone its machines are in (default: DemoBackend.zone)",
            "demo zone",
            form=True,
            max_len=40,
            setting="zone",
        ),
    )
    # its own prices, over the catalog's
    price_list = {"t4": 0.11, "a100": 1.25}
    price_source = "the demo price list"

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
