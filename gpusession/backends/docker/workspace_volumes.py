"""Workspaces on a Docker engine and in folders: what the docker and local backends share.

A container session's workspace is the named volume `gpusession-ws-<store>-<name>` (`<store>`:
the first 8 digits of the store's id), labelled with its name and the store's label, mounted read-write at /workspace (the kernel's working folder). A
fresh volume belongs to root; when the image runs as another USER, a throwaway helper container
(as root, no network) gives the volume's root folder to that user first, so the kernel can write.
"""

from __future__ import annotations

import logging

from ...configuration.agentargs import (
    WORKSPACE_LABEL,
    WORKSPACE_MOUNT,
    WORKSPACE_VOLUME_PREFIX,
    workspace_name,
    workspace_volume,
)
from ...core.errors import BackendUnavailable, BadInput, StageError
from ...core.progress import Progress
from ..base import Workspace, WorkspaceExport
from .engine import LABEL, STORE_LABEL, docker_sdk, engine_errors, short_error

log = logging.getLogger(__name__)
OWNER_TIMEOUT_S = 60.0
COPY_TIMEOUT_S = 3600.0  # a moved workspace's copy from its staging volume, inside the engine
INCOMING_SUFFIX = "-incoming"  # a workspace's staging volume while it moves in
INCOMING_LABEL = "gpusession.incoming"  # on it: the workspace's name (not listed as a workspace)
MADE_LABEL = "gpusession.made-by"  # on a workspace's volume: the token of the start that made it


def _remove_volume_if(client, name: str, labels: dict[str, str]) -> None:
    """Remove volume `name` when it exists and carries `labels` (ours); gone is fine."""
    docker = docker_sdk()
    try:
        found = client.volumes.get(name)
    except docker.errors.NotFound:
        return
    have = found.attrs.get("Labels") or {}
    if all(have.get(k) == v for k, v in labels.items()):
        found.remove(force=True)


def ensure_volume(
    client,
    name: str,
    image,
    *,
    store_label: tuple[str, str],
    helper_labels: dict[str, str],
    resume: bool,
    progress: Progress,
) -> dict[str, dict[str, str]]:
    """The workspace's volume (made when new; a resume needs it to exist), writable by the image's
    USER; returned as containers.create(volumes=...) wants it."""
    import uuid

    docker = docker_sdk()
    volume_name = workspace_volume(name, store_label[1])
    token = uuid.uuid4().hex
    with engine_errors("while looking for the workspace's volume"):
        try:
            # one request: the engine makes it, or hands over the one it has (with that one's
            # labels: this start's token there says it is new); a resume needs it to exist
            found = (
                client.volumes.get(volume_name)
                if resume
                else client.volumes.create(
                    volume_name,
                    labels={
                        WORKSPACE_LABEL: name,
                        store_label[0]: store_label[1],
                        MADE_LABEL: token,
                    },
                )
            )
        except docker.errors.NotFound:
            raise StageError(
                "provision",
                f"no workspace {name} on this engine to resume (`gpusession workspaces` lists them)",
            ) from None
        if found.attrs.get("Labels") is None and not resume:
            # Docker 20.10 answers a create of a volume it had before it restarted with no labels
            # (its inspect has them): asked again, a kept volume is not taken for another store's
            found = client.volumes.get(volume_name)
    labels = found.attrs.get("Labels") or {}
    if labels.get(store_label[0]) != store_label[1]:
        raise StageError(
            "provision",
            f"volume {volume_name} belongs to another session store; "
            "name another workspace (--workspace)",
        )
    if labels.get(MADE_LABEL) == token:
        progress.step(f"workspace {name}: new volume {volume_name}")
    else:
        progress.step(f"workspace {name}: volume {volume_name}, kept from an earlier session")
    user = (image.attrs.get("Config") or {}).get("User") or ""
    if user and user.split(":")[0] not in ("0", "root"):
        _give_to(client, image.id, volume_name, user, helper_labels)
    return {volume_name: {"bind": WORKSPACE_MOUNT, "mode": "rw"}}


def _give_to(
    client,
    image_id: str,
    volume_name: str,
    user: str,
    labels: dict[str, str],
    *,
    everything: bool = False,
) -> None:
    """chown the volume's root folder (`everything`: and all in it) to the image's USER (name or
    uid[:gid]), as root in a helper."""
    docker = docker_sdk()
    name, _, group = user.partition(":")
    if name.isdigit():
        owner = user
    else:  # a user name: the image's own passwd says its uid (and its group, unless USER names one)
        owner = f"$(id -u {name}):" + (group or f"$(id -g {name})")
    script = f"chown {'-R ' if everything else ''}{owner} {WORKSPACE_MOUNT}"
    with engine_errors("while preparing the workspace"):
        helper = client.containers.create(
            image_id,
            entrypoint=["/bin/sh"],
            command=["-c", script],
            user="0:0",
            network_mode="none",
            labels=labels,
            detach=True,
            volumes={volume_name: {"bind": WORKSPACE_MOUNT, "mode": "rw"}},
        )
        try:
            helper.start()
            code = helper.wait(timeout=OWNER_TIMEOUT_S).get("StatusCode")
            if code:
                text = helper.logs().decode(errors="replace").strip()[-300:]
                raise StageError(
                    "provision", f"cannot make the workspace writable for user {user}: {text}"
                )
        except docker.errors.APIError as exc:
            raise StageError(
                "provision",
                f"cannot make the workspace writable for user {user}: {short_error(exc)}",
            ) from None
        finally:
            helper.remove(force=True)


def engine_volumes(client, store_id_label: tuple[str, str]) -> list[tuple[str, str, int | None]]:
    """(workspace name, volume name, size in bytes or None) of this store's workspace volumes."""
    with engine_errors("while listing workspaces"):
        volumes = client.volumes.list(
            filters={"label": [WORKSPACE_LABEL, f"{store_id_label[0]}={store_id_label[1]}"]}
        )
        sizes: dict[str, int] = {}
        try:
            # the engine's df sizes everything it holds (seconds on a busy engine, one at a time
            # on Docker 20.10): asked only when this store has a volume there to size
            for v in (client.df().get("Volumes") or []) if volumes else []:
                size = (v.get("UsageData") or {}).get("Size")
                if isinstance(size, int) and size >= 0:
                    sizes[v.get("Name")] = size
        except Exception as exc:  # noqa: BLE001 - sizes are a nicety: list without them
            log.info("no volume sizes: %s", exc)
    return [
        (
            v.attrs.get("Labels", {}).get(WORKSPACE_LABEL)
            or v.name.removeprefix(WORKSPACE_VOLUME_PREFIX),
            v.name,
            sizes.get(v.name),
        )
        for v in volumes
    ]


def list_on_engines(backend, session_label: str, store_label: str) -> list:
    """The docker backend's workspaces: on the local engine and on every remote engine a recorded
    session used; `in_use_by`: the running containers that mount each. A remote engine that did
    not answer once is remembered (`Recorder.host_failed`) and not asked again until forgotten
    (`gpusession workspaces --retry-hosts`): a listing never waits on it twice."""
    failed = backend.recorder.failed_hosts(backend.name)
    hosts = [""] + sorted(
        {
            r.spec.extra.get("host")
            for r in backend.recorder.sessions(backend.name)
            if r.spec.extra.get("host") and r.spec.extra.get("host") not in failed
        }
    )
    found, reached = [], 0
    for host in hosts:
        try:
            client = backend.client(host)
            listed = engine_volumes(client, (store_label, backend.recorder.store_id))
            with engine_errors(host or "(local engine)"):
                running = client.containers.list(
                    filters={"label": [WORKSPACE_LABEL, session_label]}
                )
        except Exception as exc:  # noqa: BLE001 - one engine never hides the others' workspaces
            if host:  # the face says it once, with how to ask it again
                backend.recorder.host_failed(backend.name, host, str(exc) or type(exc).__name__)
            else:
                log.warning("workspaces: skipping the local Docker engine: %s", exc)
            continue
        reached += 1
        using: dict[str, list[str]] = {}
        for c in running:
            using.setdefault(c.labels.get(WORKSPACE_LABEL), []).append(
                c.labels.get(session_label, "")
            )
        for name, volume, size in listed:
            found.append(
                Workspace(
                    backend.name,
                    name,
                    f"volume {volume} on {host or 'the local engine'}",
                    size,
                    in_use_by=using.get(name, []),
                    details={"host": host, "volume": volume},
                )
            )
    if not reached:
        raise BackendUnavailable("no Docker engine answers")
    return found


def remove_on_engine(backend, workspace) -> None:
    """Remove the workspace's volume (the engine refuses while a container uses it: said as BadInput)."""
    docker = docker_sdk()
    client = backend.client(workspace.details.get("host") or None)
    with engine_errors("while removing the workspace"):
        try:
            client.volumes.get(workspace.details["volume"]).remove()
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) == 409:
                raise BadInput(
                    f"workspace {workspace.name} is in use by a container; stop its session first"
                ) from None
            raise


class EngineWorkspaces:
    """The docker backend's workspace operations (mixed into DockerBackend, which has `client`,
    `recorder` and `name`)."""

    def workspace_volume(self, client, record, image, labels: dict[str, str], progress: Progress):
        """(the session's workspace name, its volume as containers.create mounts it); the caller
        records the name (with what else it knows then: one write less)."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import _helper_labels

        name = workspace_name(record)
        volumes = ensure_volume(
            client,
            name,
            image,
            store_label=(STORE_LABEL, self.recorder.store_id),
            helper_labels=_helper_labels(labels),
            resume=bool(record.spec.extra.get("resume")),
            progress=progress,
        )
        return name, volumes

    def list_workspaces(self) -> list:
        return list_on_engines(self, LABEL, STORE_LABEL)

    def export_workspace(self, record, progress: Progress):
        """The volume read by a helper container (made, never started) that mounts it read-only,
        through the engine's archive API: the same over an ssh:// engine."""
        client = self.client(record.spec.extra.get("host"))
        volume = workspace_volume(
            record.resource.get("workspace") or workspace_name(record), self.recorder.store_id
        )
        size = dict(
            (v, n) for _, v, n in engine_volumes(client, (STORE_LABEL, self.recorder.store_id))
        ).get(volume)
        helper = self._archive_helper(client, record, volume, "ro", progress)
        with engine_errors("while reading the workspace"):
            stream, _ = helper.get_archive(WORKSPACE_MOUNT, chunk_size=1 << 20)

        def close() -> None:
            with engine_errors("while removing a helper container"):
                helper.remove(force=True)

        return WorkspaceExport(size, stream, close)

    def import_workspace(self, record, chunks, progress: Progress) -> None:
        """The stream is put into a staging volume first (by a helper container, made, never
        started, through the engine's archive API); only once it is whole does it replace an older
        copy of this workspace on the engine (copied over inside the engine). A stream cut short
        (its source failed, the connection dropped) lands nowhere: the older copy stays as it
        was, and no half-filled volume is left for a later `--resume` to take for the whole."""
        client = self.client(record.spec.extra.get("host"))
        name = workspace_name(record)
        volume = workspace_volume(name, self.recorder.store_id)
        staging = f"{volume}{INCOMING_SUFFIX}"
        store = {STORE_LABEL: self.recorder.store_id}
        with engine_errors("while making the workspace's staging volume"):
            _remove_volume_if(client, staging, store)  # one an earlier cut import left
            client.volumes.create(staging, labels={INCOMING_LABEL: name, **store})
        source_failed: list[BaseException] = []

        def source():
            try:
                yield from chunks
            except BaseException as exc:
                source_failed.append(exc)
                raise

        try:
            helper = self._archive_helper(client, record, staging, "rw", progress)
            try:
                with engine_errors("while writing the workspace"):
                    if not helper.put_archive("/", source()):
                        raise StageError(
                            "move", f"the engine refused the workspace's files ({volume})"
                        )
            except Exception:
                if source_failed:  # the source's error (the engine only saw the stream end)
                    raise source_failed[0] from None
                raise
            finally:
                with engine_errors("while removing a helper container"):
                    helper.remove(force=True)
            self._replace_with(client, record, staging, volume, name, progress)
        finally:
            with engine_errors("while removing the workspace's staging volume"):
                _remove_volume_if(client, staging, store)

    def _replace_with(self, client, record, staging: str, volume: str, name: str, progress) -> None:
        """The workspace's volume made anew from the whole staging volume (an older copy removed
        first: refused when another store's, or in use); a copy that fails is removed."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import _helper_labels

        docker = docker_sdk()
        store = {STORE_LABEL: self.recorder.store_id}
        with engine_errors("while making the workspace's volume"):
            try:
                old = client.volumes.get(volume)
                if (old.attrs.get("Labels") or {}).get(STORE_LABEL) != self.recorder.store_id:
                    raise StageError(
                        "move", f"volume {volume} belongs to another session store; not replaced"
                    )
                progress.step(f"replacing the older copy of workspace {name} there")
                try:
                    old.remove()
                except docker.errors.APIError as exc:
                    raise StageError(
                        "move", f"the older copy of workspace {name} is in use: {short_error(exc)}"
                    ) from None
            except docker.errors.NotFound:
                pass
            made = client.volumes.create(volume, labels={WORKSPACE_LABEL: name, **store})
        labels = _helper_labels({LABEL: record.id, **store})
        image = self._helper_image(client, record, progress)
        try:
            with engine_errors("while copying the workspace into its volume"):
                copier = client.containers.create(
                    image.id,
                    entrypoint=["/bin/sh"],
                    command=["-c", f"cp -a /incoming/. {WORKSPACE_MOUNT}/"],
                    user="0:0",
                    network_mode="none",
                    labels=labels,
                    volumes={
                        staging: {"bind": "/incoming", "mode": "ro"},
                        volume: {"bind": WORKSPACE_MOUNT, "mode": "rw"},
                    },
                    detach=True,
                )
                try:
                    copier.start()
                    code = copier.wait(timeout=COPY_TIMEOUT_S).get("StatusCode")
                    if code:
                        said = copier.logs().decode(errors="replace").strip()[-300:]
                        raise StageError("move", f"cannot copy the workspace into {volume}: {said}")
                finally:
                    copier.remove(force=True)
        except BaseException:
            with engine_errors("while removing a half-made workspace volume"):
                made.remove(force=True)
            raise
        # the files keep their owners from where they were; the image's USER must own them here
        user = (image.attrs.get("Config") or {}).get("User") or ""
        if user and user.split(":")[0] not in ("0", "root"):
            _give_to(client, image.id, volume, user, labels, everything=True)

    def _helper_image(self, client, record, progress: Progress):
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import find_or_pull_image

        return find_or_pull_image(
            client, record.spec.extra.get("image") or self.default_image(), progress
        )

    def _archive_helper(self, client, record, volume: str, mode: str, progress: Progress):
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import _helper_labels

        image = self._helper_image(client, record, progress)
        # the engine a helper labelled with this session lands on: a stop (or whoever settles a
        # switch whose driver died mid-move) asks it, even before the session's own container
        if "engine" not in record.resource:
            self.recorder.save(record.id, engine=record.spec.extra.get("host") or "")
        with engine_errors("while making a helper container for the workspace"):
            return client.containers.create(
                image.id,
                entrypoint=["/bin/sh"],
                command=[],
                user="0:0",
                network_mode="none",
                labels=_helper_labels({LABEL: record.id, STORE_LABEL: self.recorder.store_id}),
                volumes={volume: {"bind": WORKSPACE_MOUNT, "mode": mode}},
                detach=True,
            )

    def remove_workspace(self, workspace) -> None:
        remove_on_engine(self, workspace)
