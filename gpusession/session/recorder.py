"""The session layer's side of the backends' `Recorder`: what a backend reports is written to
the store here, so backends never see the store itself."""

from __future__ import annotations

from typing import Any

from ..core.models import SessionRecord
from .store import Store


class StoreRecorder:
    """`gpusession.backends.base.Recorder`, written to a `Store`."""

    def __init__(self, store: Store):
        self._store = store
        self.store_id = store.store_id

    def save(self, session_id: str, **values: Any) -> None:
        self._store.update_resource(session_id, **values)

    def note(self, session_id: str, text: str) -> None:
        self._store.note(session_id, text)

    def set_price(self, session_id: str, price_per_hour: float, detail: str) -> None:
        self._store.set_price(session_id, price_per_hour, detail)

    def sessions(self, backend: str) -> list[SessionRecord]:
        return [r for r in self._store.list() if r.spec.backend == backend]

    def failed_hosts(self, backend: str) -> set[str]:
        return {host for _, host in self._store.failed_hosts(backend)}

    def host_failed(self, backend: str, host: str, error: str) -> None:
        self._store.host_failed(backend, host, error)
