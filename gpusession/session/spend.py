"""What sessions cost, as data: this month's spend against the monthly budget, the spend report,
right-sizing advice, the clouds' live prices and the catalog's refresh (docs/cost.md).

`SessionManager` makes one `Spend` (`manager.spend`) and hands it the narrow things it uses;
the faces put what it returns into words (gpusession/words/).
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..backends import Backend, ListedPrices
from ..configuration.advice import advice_document, could_save
from ..configuration.catalog import packaged_catalog, write_user_snapshot
from ..configuration.cost import budget_status, month_start, report_start, spend_report
from ..configuration.registry import backend_names, load_backend_class
from ..configuration.settings import env_var, load_policy
from ..core.errors import GpuSessionError
from ..core.models import SessionRecord, State
from .store import Store

if TYPE_CHECKING:
    from ..configuration.catalog import Catalog
    from ..configuration.config import GpuSessionConfig


# How long one reading of the store stands for "now" in every figure of money (issue 32 §5):
# the sidebar's header, each card's budget warning, the Spend view and `GET report` asked within
# it show the same dollars to the cent. A start's budget check always reads afresh.
READING_S = 10.0


@dataclasses.dataclass(frozen=True)
class Reading:
    """The store as read once: every sum of money shown at one moment is made from it."""

    at: float  # when it was read (unix s): running sessions are counted up to then
    records: tuple[SessionRecord, ...]  # every session record, as the store had them


def budget_where(config: Any) -> tuple[str, str]:
    """Where the monthly budget this process reads is set, and how to change it there (the
    sidebar's budget is the Jupyter server's, which a notebook's `%config` does not change)."""
    var, origin = env_var("monthly_budget"), config.origin("monthly_budget")
    reader = getattr(config, "read_by", "process")
    if reader == "server":
        if origin == "env":
            return (
                f"{var} in the Jupyter server's environment",
                "change it there and restart JupyterLab (a notebook's %config does not change it)",
            )
        return (
            "the Jupyter server's c.GpuSessionConfig.monthly_budget (jupyter_server_config.py "
            "or its command line)",
            "change it there and restart JupyterLab (a notebook's %config does not change it)",
        )
    if reader == "notebook":
        where = (
            f"{var} in this kernel's environment"
            if origin == "env"
            else ("this notebook's GpuSessionConfig.monthly_budget")
        )
        return where, "`%config GpuSessionConfig.monthly_budget = 500` changes it for this notebook"
    if reader == "cli":
        return f"{var} in your environment", f"set {var}=500 for the CLI"
    return (
        "GpuSessionConfig.monthly_budget / " + var,
        f"raise it in the config that sets it, or {var}",
    )


class Spend:
    """Budget, report, advice and prices. One per SessionManager (`.spend`).

    store: the records the spend is summed from;
    config: `monthly_budget` and `regions` (GpuSessionConfig, or the CLI's EnvConfig);
    catalog: the GPU catalog, read when asked (the user's refreshed prices as soon as written);
    backend: a backend by name (SessionManager.backend), for its live prices and price list;
    checked: the records, running ones checked alive first (SessionManager.list(check=True));
    summary: a running session's agent summary by key (raises GpuSessionError when it has
      ended meanwhile or its agent does not answer)."""

    def __init__(
        self,
        store: Store,
        config: "GpuSessionConfig",
        *,
        catalog: Callable[[], "Catalog"],
        backend: Callable[[str], Backend],
        checked: Callable[[], list[SessionRecord]],
        summary: Callable[[str], "dict | None"],
    ):
        self.store, self.config = store, config
        self._catalog, self._backend = catalog, backend
        self._checked, self._summary = checked, summary
        self._lock = threading.Lock()
        self._reading: Reading | None = None

    def reading(self, *, fresh: bool = False) -> Reading:
        """The store as read at most READING_S ago (`fresh`: read now), shared by every figure."""
        with self._lock:
            kept = self._reading
        if not fresh and kept is not None and 0 <= time.time() - kept.at <= READING_S:
            return kept
        now = Reading(time.time(), tuple(self.store.list()))
        with self._lock:
            self._reading = now
        return now

    def budget(self, reading: Reading | None = None, *, fresh: bool = False) -> dict | None:
        """This calendar month's spend (UTC, as the report counts it) against the monthly budget
        (gpusession/configuration/cost.py budget_status), from `reading` (default: the shared
        one; `fresh`: the store read now); None when no budget is set."""
        budget = float(self.config.monthly_budget or 0.0)
        policy = load_policy()
        cap = policy.monthly_cap if policy is not None else None
        capped = cap is not None and (budget <= 0 or cap <= budget)  # the policy's cap binds
        budget = cap if capped else budget
        if not budget or budget <= 0:
            return None
        reading = reading or self.reading(fresh=fresh)
        since = month_start(reading.at)
        spent = spend_report(list(reading.records), since=since, by="type", at=reading.at)
        spent = spent["total"]["cost"]
        if capped:
            source = f"the monthly cap of your policy {policy.path}"  # type: ignore[union-attr]
            change = "only its administrator can raise it"
        else:
            source, change = budget_where(self.config)
        status = budget_status(spent, budget, month=since, source=source)
        if status is not None:
            status["change"] = change  # how to raise it, where it is set
        if status is not None and capped:
            status["policy"] = policy.path  # type: ignore[union-attr]
        return status

    def advice(self, key: str, *, live: bool = True) -> dict:
        """Right-sizing advice (gpusession/configuration/advice.py) as data, from the agent's summary: asked of
        the agent while the session runs (`live`), else the one kept when it stopped. Adds
        `name` and `state`."""
        record = self.store.get(key)
        summary = None
        if live and record.state == State.RUNNING:
            try:
                summary = self._summary(record.id)
            except GpuSessionError:  # ended meanwhile, or the agent does not answer
                record = self.store.get(record.id)
        summary = summary or record.resource.get("agent_summary")
        doc = advice_document(
            summary,
            gpu_type=record.spec.gpu_type,
            gpu_count=record.spec.gpu_count,
            spot=record.spec.extra.get("spot"),
            catalog=self._catalog(),
            backend=record.spec.backend,
        )
        return dict(doc, name=record.name, state=record.state.value)

    def report(
        self, since: str | float | None = "30d", by: str = "type", split: str | None = None
    ) -> dict:
        """The spend report as data (gpusession/configuration/cost.py `spend_report`): the sessions billed in
        the last `since` (the duration grammar), a row per `by`, running sessions counted up to
        now (checked first, so one that ended is counted until it ended). The store is read
        once for it, and that reading is the one the other faces share for READING_S."""
        report_start(since, time.time())  # bad input is said before anything is read
        self._checked()  # running ones checked: what ended meanwhile is recorded ended
        reading = self.reading(fresh=True)
        at = reading.at
        doc = spend_report(
            list(reading.records),
            since=report_start(since, at),
            by=by,
            at=at,
            split=split,
            catalog_prices=self._catalog_prices,
            could_save=lambda r: could_save(
                r.resource.get("agent_summary"),
                gpu_type=r.spec.gpu_type,
                gpu_count=r.spec.gpu_count,
                catalog=self._catalog(),
                spot=r.spec.extra.get("spot"),
                backend=r.spec.backend,
            ),
        )
        return dict(doc, catalog_date=self._catalog().snapshot_date, budget=self.budget(reading))

    def _catalog_prices(self, record: SessionRecord) -> tuple[float, ...]:
        """The table prices of a session's GPUs (`Backend.catalog_prices`: the catalog's rate,
        or its backend's own table), the catalog's rate when its backend is not installed."""
        catalog = self._catalog()
        try:
            gpu = catalog.get(record.spec.gpu_type)
        except GpuSessionError:  # a type the catalog no longer has
            return ()
        try:
            cls = load_backend_class(record.spec.backend)
        except GpuSessionError:  # a backend no longer installed
            return (catalog.price_per_hour(gpu, record.spec.gpu_count),)
        spot = bool(record.spec.extra.get("spot"))
        return cls.catalog_prices(catalog, gpu, record.spec.gpu_count, spot=spot)

    def live_prices(self, types: list[str] | None = None) -> list[dict[str, Any]]:
        """The clouds' current prices (`Backend.live_prices`: each compares the regions of its
        own settings that a policy allows), of `types` only when given, each row with its
        `backend`."""
        rows: list[dict[str, Any]] = []
        for name in backend_names():
            if load_backend_class(name).live_prices is Backend.live_prices:
                continue  # own hardware: no live prices to ask for
            rows += [
                dict(r, backend=name)
                for r in self._backend(name).live_prices(self._catalog(), types)
            ]
        return rows

    def refresh_catalog(self) -> dict[str, Any]:
        """`gpusession catalog refresh`: the clouds' on-demand list prices (`Backend.list_prices`
        of each backend with a price list: its own table's rows), written as the user's dated
        snapshot (catalog.py) that every face then uses: the catalog's reference rates they give,
        and what each backend keeps for its table. Data {"path", "date", "priced", "of",
        "changed", "missing", "was", "rows"}. A failure (no credentials) writes nothing and says
        the date the prices stay at."""
        was, base = self._catalog().snapshot_date, packaged_catalog()
        listed: dict[str, ListedPrices] = {}
        for name in backend_names():
            if load_backend_class(name).list_prices is Backend.list_prices:
                continue  # own hardware: no price list
            try:
                found = self._backend(name).list_prices(base)
            except GpuSessionError as exc:
                raise type(exc)(
                    f"the catalog was not refreshed (its prices stay those of {was}): {exc}"
                ) from None
            if found is not None:
                listed[name] = found
        asked = [row for found in listed.values() for row in found.asked]
        priced = [row for found in listed.values() for row in found.priced]
        rows = ", ".join(dict.fromkeys(found.rows for found in listed.values())) or "prices"
        if not priced:
            raise GpuSessionError(
                f"no price list priced any of the catalog's {len(asked)} {rows}: the "
                f"catalog was not refreshed (its prices stay those of {was})"
            )
        date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        regions = ", ".join(dict.fromkeys(f.region for f in listed.values() if f.region))
        path = write_user_snapshot(
            {k: v for found in listed.values() for k, v in found.rates.items()},
            date=date,
            source=f"on-demand list prices of the {', '.join(listed)} price list ({regions}) "
            f"on {date}; spot and the rest from the package's catalog of {base.snapshot_date}",
            backends={name: found.kept for name, found in listed.items()},
        )
        return {
            "path": str(path),
            "date": date,
            "was": was,
            "priced": len(priced),
            "of": len(asked),
            "rows": rows,
            "changed": [row for found in listed.values() for row in found.changed],
            "missing": [row for row in asked if row not in priced],
        }
