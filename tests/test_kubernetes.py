"""The kubernetes backend on a real cluster (scripts/ci-kubernetes.sh: etcd, the API server, the
scheduler and two kubelets over containerd, built from Go modules): n1 has 2 x Tesla-T4, n2 one
NVIDIA-A100-SXM4-40GB, advertised as the extended resource nvidia.com/gpu, so placement and
queueing by GPU count and model are the scheduler's own. The kernels are real, in pods of an
image without ipykernel (the runtime brings it over exec), reached through the API server's
port-forward. One cluster for all, its tests in two lanes that run at once, each with a namespace
of its own (tests/support/kube.py: which lane a test may be in); each test's store labels its pods,
so a test cleans only its own."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpusession.core.errors import BadInput, StageError
from gpusession.core.models import State
from gpusession.core.protocol import StopKind
from gpusession.session.store import Store
from support.kube import (
    IMAGE,
    KUBECONFIG,
    KUBECTL,
    LANE_1,
    LANE_2,
    NAMESPACE,
    REPO,
    SLOT,
    STATE,
    ci_kubernetes,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]  # and a lane each: LANE_1, LANE_2

PRODUCT = "gpusession/cuda:ci"  # root, ipykernel and pip in a venv
NUMPY = "gpusession-ci/py-numpy:latest"  # USER 1000 (jovyan), Debian's numpy: saved arrays
LABEL = "gpusession.session"
STORE_LABEL = "gpusession.session.store"


@pytest.fixture
def kube_env(kube, kube_config, nb_env, monkeypatch) -> dict[str, str]:
    """This test's store and this worker's kubeconfig (its namespace, NAMESPACE); its pods (by
    its store's label) go at the end, whatever the test left, and are gone before the lane's next
    test starts one (a T4 still held would be the other lane's: support.kube)."""
    monkeypatch.setenv("KUBECONFIG", str(kube_config))
    nb_env["KUBECONFIG"] = str(kube_config)
    yield nb_env
    store_id = _store(nb_env).store_id
    for pod in _ours(kube, store_id=store_id):
        _drop(kube, pod.metadata.name)
    deadline = time.monotonic() + 60
    while _ours(kube, store_id=store_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    for claim in _claims(kube, store_id):  # every session has a workspace: its claim
        kube.delete_namespaced_persistent_volume_claim(claim.metadata.name, NAMESPACE)


@pytest.fixture
def kube_manager(kube_env):
    from support.managed import managed

    yield from managed()


def _drop(kube, name: str, namespace: str = NAMESPACE) -> None:
    """A test's pod gone whatever it left: our finalizer taken off, deleted at once."""
    import kubernetes

    try:
        kube.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
        kube.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def _store(env) -> Store:
    return Store(Path(env["GPUSESSION_HOME"]) / "sessions.sqlite3")


def _ours(kube, session_id: str | None = None, store_id: str | None = None) -> list:
    selector = f"{LABEL}={session_id}" if session_id else LABEL
    if store_id:
        selector += f",{STORE_LABEL}={store_id}"
    return kube.list_namespaced_pod(NAMESPACE, label_selector=selector).items


def _claims(kube, store_id: str) -> list:
    selector = f"gpusession.workspace,{STORE_LABEL}={store_id}"
    return kube.list_namespaced_persistent_volume_claim(NAMESPACE, label_selector=selector).items


def _gpus_held(kube, node: str) -> int:
    """nvidia.com/gpu requested by this worker's pods on `node` that still hold it (what the
    scheduler counts: every pod not ended), in its namespace: the other lane's are its own."""
    pods = kube.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items
    return sum(
        int((c.resources.limits or {}).get("nvidia.com/gpu", 0))
        for p in pods
        if p.status.phase not in ("Succeeded", "Failed")
        for c in p.spec.containers
    )


def _wait_gone(kube, session_id: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _ours(kube, session_id):
            return True
        time.sleep(0.5)
    return False


def _spec(manager, gpu: str, name: str, **extra):
    return manager.make_spec(gpu, backend="kubernetes", **{"image": IMAGE, "name": name, **extra})


@LANE_2
def test_a_notebook_runs_cells_in_a_t4_pod_on_n1_and_stop_frees_its_gpu(kube, kube_env, tmp_path):
    from support.notebook_kernel import NotebookKernel

    nk = NotebookKernel(kube_env, cwd=str(tmp_path))
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        start = nk.run(
            f"%gpu start --backend kubernetes --type t4 --image {IMAGE} --idle off --name kt4"
        )
        assert start.status == "ok", start.text
        assert "running: session kt4 is ready" in start.text, start.text
        assert "runs on n1" in start.text, start.text
        # as the status says the pod runs, or earlier where this image's Python is known already
        assert re.search(r"runtime: cop(ying|ied) ipykernel and pip", start.text), start.text
        record = _store(kube_env).get("kt4")
        (pod,) = _ours(kube, record.id)
        assert pod.spec.node_name == "n1" and record.resource["node"] == "n1"
        (container,) = pod.spec.containers
        assert container.resources.limits == {"nvidia.com/gpu": "1"}
        assert pod.spec.node_selector == {"nvidia.com/gpu.product": "Tesla-T4"}
        assert pod.metadata.labels[STORE_LABEL] == _store(kube_env).store_id
        assert _gpus_held(kube, "n1") >= 1

        cell = nk.run("%%gpu\nx = 20\nx * 2 + 1 + 1")
        assert cell.status == "ok" and "42" in cell.text, cell.text
        again = nk.run(
            "%%gpu\nimport os, sys\nprint(x, os.environ['GPUSESSION_SESSION_ID'], sys.executable)"
        )
        assert again.text.split() == ["20", record.id, "/usr/bin/python3"], again.text
        # the kernel listens on the pod's loopback only; nothing exposes it in the cluster
        services = kube.list_namespaced_service(NAMESPACE).items
        assert [s.metadata.name for s in services] == []
        assert not pod.spec.containers[0].ports

        stop = nk.run("%gpu stop")
        assert stop.status == "ok", stop.text
        assert not _ours(kube, record.id), "stop returns once the pod is gone"
        assert _gpus_held(kube, "n1") == 0
        assert _store(kube_env).get("kt4").state == State.STOPPED
    finally:
        nk.close()


@LANE_1
def test_an_a100_lands_on_n2_and_the_next_one_waits_with_the_scheduler_reason(kube, kube_manager):
    m = kube_manager
    first = m.start(_spec(m, "a100", "ka1", idle="off"))
    try:
        assert first.run("y = 7\ny * 6")["status"] == "ok"
        assert m.get("ka1").resource["node"] == "n2"
        # another process attaches from the record alone (its log's READY is not needed)
        from gpusession.session import SessionManager
        from support.sinks import Collect

        other, sink = SessionManager(), Collect()
        try:
            assert other.attach("ka1").run("print(y)", sink)["status"] == "ok"
            assert sink.text.strip() == "7"
        finally:
            other.close()
        (pod,) = _ours(kube, first.id)
        assert pod.spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}

        lines: list[str] = []
        started = time.monotonic()
        with pytest.raises(StageError) as refused:
            m.start(_spec(m, "a100", "ka2", idle="off", queue_timeout="10s"), report=lines.append)
        waited = time.monotonic() - started
        said = "\n".join(lines)
        assert "0/2 nodes are available" in said and "Insufficient nvidia.com/gpu" in said, said
        assert "waits (" in said, said
        assert "still waits after 10s (--queue-timeout)" in str(refused.value)
        assert 10 <= waited < 45, waited
        second = m.get("ka2")
        assert second.state == State.FAILED
        assert not _ours(kube, second.id), "the queued pod is deleted when the start gives up"

        # a fallback list, one type after another (issue 34 §3): n2's A100 is held, so the a100
        # is passed over at once, saying each node's count, and the t4 runs on n1
        third = m.start(_spec(m, "a100,t4", "kfb", idle="off"))
        record = m.get(third.id)
        assert record.spec.gpu_type == "t4" and record.resource["node"] == "n1"
        (passed,) = record.spec.extra["passed_over"]
        assert passed == {
            "type": "a100:1",
            "why": "no node of context gpusession-ci has 1 free nvidia.com/gpu of a100 now "
            "(n2: 0 of 1 free)",
        }, passed
        m.stop("kfb")
    finally:
        m.stop("ka1")
    assert _wait_gone(kube, first.id, timeout=1) and _gpus_held(kube, "n2") == 0


@LANE_2
def test_three_gpus_stay_pending_and_the_cli_gives_up_at_the_queue_timeout(kube, kube_env):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gpusession", "start", "--backend", "kubernetes", "--type", "t4:3",
         "--image", IMAGE, "--name", "k3", "--queue-timeout", "10s"],
        env=kube_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    err = done.stderr.strip().splitlines()
    assert err and "Insufficient nvidia.com/gpu" in err[-1] and "--queue-timeout" in err[-1], err
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60
    record = _store(kube_env).get("k3")
    assert record.state == State.FAILED and not _ours(kube, record.id)


@LANE_2
def test_gc_removes_the_pod_of_a_start_whose_process_was_killed(kube, kube_env):
    start = subprocess.Popen(
        [sys.executable, "-m", "gpusession", "start", "--backend", "kubernetes", "--type", "t4",
         "--image", IMAGE, "--name", "kgc", "--idle", "off"],
        env=kube_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        store = _store(kube_env)
        while time.monotonic() < deadline and not _ours(kube, store_id=store.store_id):
            time.sleep(0.3)
        assert _ours(kube, store_id=store.store_id), "the start made no pod"
    finally:
        start.send_signal(signal.SIGKILL)
        start.wait(10)
    record = store.get("kgc")
    assert record.state.active and _ours(kube, record.id), "the pod outlives its starter"
    gc = subprocess.run(
        [sys.executable, "-m", "gpusession", "gc"],
        env=kube_env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert gc.returncode == 0, gc.stderr
    assert "kgc" in gc.stdout, gc.stdout
    assert _wait_gone(kube, record.id, timeout=5), "gc left the pod"
    assert not store.get("kgc").state.active


@LANE_1
def test_an_idle_pod_ends_by_its_agents_decision_and_the_record_says_why(kube, kube_manager):
    m = kube_manager
    session = m.start(_spec(m, "t4", "kidle", idle="20s"))
    assert session.run("z = 1")["status"] == "ok"
    deadline = time.monotonic() + 90
    record = m.get("kidle")
    while time.monotonic() < deadline and record.state == State.RUNNING:
        time.sleep(2)
        record = m.refresh_state("kidle")
    assert record.state == State.STOPPED, record.state
    assert record.stop_reason is not None and record.stop_reason.kind is StopKind.IDLE
    pods = _ours(kube, record.id)
    assert all(p.status.phase in ("Succeeded", "Failed") for p in pods), "an ended pod holds no GPU"
    assert _gpus_held(kube, "n1") == 0


CUT_CELL = (
    "import time\nfor i in range({n}):\n    print(f'line {{i}}', flush=True)\n    time.sleep(0.1)"
)


@LANE_2
def test_cut_port_forward_streams_reconnect_and_a_streaming_cell_loses_no_line(kube, kube_manager):
    """The streams' connections to the API server cut during cells that print at 10 Hz (as a
    proxy or a restarted API server cuts them): each local connection closes, ZMQ connects again
    through a new stream, and every line arrives once, in order."""
    from support.sinks import Collect

    m = kube_manager
    session = m.start(_spec(m, "t4", "kcut", idle="off"))
    link = session.link
    for run in range(3):

        def cut(delay=0.7 + 0.3 * run):
            time.sleep(delay)
            for stream in list(link.streams):
                stream.websocket.sock.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=cut, daemon=True).start()
        sink = Collect()
        reply = session.run(CUT_CELL.format(n=30), sink)
        assert reply["status"] == "ok", reply
        assert sink.text.splitlines() == [f"line {i}" for i in range(30)], sink.text
    assert link.reconnects >= 3 and link.healthy()
    notes = " ".join(e.detail for e in m.get("kcut").events)
    assert "port-forward: the stream to port" in notes, notes


def _kubectl(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def documented_role(namespace: str) -> str:
    """The Role docs/kubernetes.md gives ("The least Role"), for `namespace`."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    block = text.split("## The least Role", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "namespace: ml" in block
    return block.replace("namespace: ml", f"namespace: {namespace}")


def _account(namespace: str, tmp_path: Path) -> Path:
    """A service account of `namespace` bound to the documented Role there, and a kubeconfig
    that logs in as it (a token, as in a cluster whose users are accounts)."""
    _kubectl("create", "namespace", namespace)
    _kubectl("-n", namespace, "create", "serviceaccount", "gs")
    binding = (
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"
        f"metadata: {{name: gpusession, namespace: {namespace}}}\n"
        "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: gpusession}\n"
        f"subjects: [{{kind: ServiceAccount, name: gs, namespace: {namespace}}}]\n"
    )
    _kubectl("apply", "-f", "-", stdin=documented_role(namespace) + "---\n" + binding)
    token = _kubectl("-n", namespace, "create", "token", "gs", "--duration=1h").strip()
    path = tmp_path / f"{namespace}.kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: ci, cluster: {{server: 'https://10.220.0.1:16443', "
        f"certificate-authority: '{STATE / 'pki' / 'ca.crt'}'}}}}]\n"
        f"users: [{{name: gs, user: {{token: '{token}'}}}}]\n"
        f"contexts: [{{name: gs, context: {{cluster: ci, user: gs, namespace: {namespace}}}}}]\n"
        "current-context: gs\n"
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def accounts(kube, tmp_path):
    """Two namespaces, each with its own account bound to the documented Role in it only."""
    tag = f"{os.getpid()}-{int(time.time() * 1000) % 100000}"  # each test's own namespaces
    names = [f"gs-rbac-{tag}", f"gs-other-{tag}"]
    try:
        yield [_account(n, tmp_path) for n in names]
    finally:
        for n in names:
            subprocess.run(
                [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), "delete", "namespace", n,
                 "--wait=false"], capture_output=True, timeout=60, check=False,
            )  # fmt: skip


@LANE_2
def test_the_documented_role_is_enough_and_another_namespaces_account_reaches_nothing(
    kube, kube_env, accounts, monkeypatch
):
    import kubernetes

    from gpusession.session import SessionManager

    own, other = accounts
    monkeypatch.setenv("KUBECONFIG", str(own))
    m = SessionManager()
    try:
        session = m.start(_spec(m, "t4", "krbac", idle="off"))
        assert session.run("w = 6\nprint(w * 7)")["status"] == "ok"
        record = m.get("krbac")
        namespace, pod = record.resource["namespace"], record.resource["pod"]
        assert namespace.startswith("gs-rbac-")

        stranger = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(config_file=str(other))
        )
        with pytest.raises(kubernetes.client.ApiException) as listed:
            stranger.list_namespaced_pod(namespace)
        assert listed.value.status == 403
        for connect, extra in (
            (stranger.connect_get_namespaced_pod_exec, {"command": ["true"], "stdout": True}),
            (stranger.connect_get_namespaced_pod_portforward, {"ports": "1"}),
        ):
            with pytest.raises(kubernetes.client.ApiException) as refused:
                kubernetes.stream.stream(connect, pod, namespace, **extra)
            assert "forbidden" in str(refused.value), refused.value
        stranger.api_client.close()

        m.stop("krbac")
        assert m.get("krbac").state == State.STOPPED
    finally:
        m.close()


@LANE_2
def test_a_quota_refusal_and_an_image_no_node_can_pull_are_said_in_the_clusters_words(
    kube, kube_manager, tmp_path, monkeypatch
):
    m = kube_manager
    with pytest.raises(BadInput, match="no namespace gs-none in context gpusession-ci"):
        m.start(_spec(m, "t4", "knone", namespace="gs-none"))
    assert m.list() == [], "a refused start records nothing"
    namespace = f"gs-quota-{os.getpid()}"
    _kubectl("create", "namespace", namespace)
    try:
        _kubectl("-n", namespace, "create", "quota", "gpus", "--hard=requests.nvidia.com/gpu=0")
        with pytest.raises(StageError) as refused:
            m.start(_spec(m, "t4", "kquota", idle="off", namespace=namespace))
        assert "the cluster refused the pod" in str(refused.value)
        assert "exceeded quota: gpus" in str(refused.value), refused.value
        assert m.get("kquota").state == State.FAILED
    finally:
        _kubectl("delete", "namespace", namespace, "--wait=false")

    lines: list[str] = []
    with pytest.raises(StageError) as unpulled:
        m.start(
            m.make_spec(
                "t4", backend="kubernetes", image="gpusession-ci/not-built:1", name="kpull",
                idle="off", queue_timeout="10s",
            ),
            report=lines.append,
        )  # fmt: skip
    said = "\n".join(lines) + str(unpulled.value)
    assert "gpusession-ci/not-built:1" in said and ("ErrImagePull" in said or "BackOff" in said), (
        said
    )
    assert not _ours(kube, m.get("kpull").id), "the pod that could not pull is deleted"


@LANE_2
def test_setup_finds_the_clusters_gpus(kube, kube_env, monkeypatch):
    """`gpusession setup` asks each kubeconfig context's cluster for its nodes: the test cluster's
    GPUs by product, offered as a place for the kubernetes backend."""
    from gpusession.backends.kubernetes import KubernetesBackend

    monkeypatch.setenv("KUBECONFIG", kube_env["KUBECONFIG"])
    (place,) = KubernetesBackend.discover()
    assert (place.kind, place.backend, place.usable) == ("kubernetes", "kubernetes", True), place
    assert place.gpus == "2 x Tesla-T4, 1 x NVIDIA-A100-SXM4-40GB", place


# -- workspaces: a PersistentVolumeClaim each ------------------------------------------------


@pytest.fixture(scope="session")
def numpy_image(kube):
    ci_kubernetes("load", NUMPY)
    return NUMPY


@pytest.fixture
def product_image(kube):
    """The image with ipykernel and pip (Dockerfile.cuda's recipe: scripts/ci-host-setup.sh)."""
    ci_kubernetes("load", PRODUCT)
    return PRODUCT


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@LANE_2
def test_the_default_storage_class_binds_a_claim_that_a_pod_writes_into(kube):
    """The test cluster's storage (ci-kubernetes.sh: the controller manager's hostPath
    provisioner, a default StorageClass): a claim without a class binds, a pod writes into it,
    and its folder goes with it."""
    name = f"gs-storage-{SLOT}"
    kube.create_namespaced_persistent_volume_claim(
        NAMESPACE,
        {
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Mi"}},
            },
        },
    )
    try:
        pod = {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
                "containers": [
                    {
                        "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "echo written by a pod > /data/f"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
            },
        }  # fmt: skip
        kube.create_namespaced_pod(NAMESPACE, pod)
        deadline = time.monotonic() + 60
        while kube.read_namespaced_pod(name, NAMESPACE).status.phase != "Succeeded":
            assert time.monotonic() < deadline, kube.read_namespaced_pod(name, NAMESPACE).status
            time.sleep(0.5)
        claim = kube.read_namespaced_persistent_volume_claim(name, NAMESPACE)
        assert claim.status.phase == "Bound" and claim.spec.storage_class_name == "hostpath"
        volume = kube.read_persistent_volume(claim.spec.volume_name)
        folder = Path(volume.spec.host_path.path)
        assert (folder / "f").read_text() == "written by a pod\n"
    finally:
        kube.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        kube.delete_namespaced_persistent_volume_claim(name, NAMESPACE)
    deadline = time.monotonic() + 60
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not folder.exists(), "reclaimPolicy Delete: the folder goes with the claim"


@LANE_1
def test_a_workspace_claim_keeps_files_an_array_and_variables_across_stop_and_resume(
    kube, kube_env, kube_manager, numpy_image
):
    m, ws = kube_manager, f"w1-{SLOT}"
    lines: list[str] = []
    first = m.start(
        m.make_spec("t4", backend="kubernetes", image=numpy_image, name="kws1", idle="off",
                    workspace=ws),
        report=lines.append,
    )  # fmt: skip
    record = m.get("kws1")
    claim = record.resource["claim"]
    assert f"workspace {ws}: new claim {claim} (10Gi, the default storage class)" in "\n".join(
        lines
    ), lines
    cell = (
        "import os, numpy as np\narr = np.arange(12).reshape(3, 4) * 1.5\nv = 'kept'\n"
        "open('notes.txt', 'w').write('written in the workspace')\nprint(os.getcwd(), os.getuid())"
    )
    from support.sinks import Collect

    sink = Collect()
    assert first.run(cell, sink)["status"] == "ok", sink.text
    assert sink.text.split() == ["/workspace", "1000"], "a USER 1000 image writes there"
    (pod,) = _ours(kube, record.id)
    assert {
        v.persistent_volume_claim.claim_name for v in pod.spec.volumes if v.persistent_volume_claim
    } == {claim}
    stopped = m.stop("kws1", save=True)
    assert stopped.resource["checkpoint"]["committed"], stopped.resource["checkpoint"]
    assert _wait_gone(kube, record.id, timeout=1), "stop returns once the pod is gone"
    kept = kube.read_namespaced_persistent_volume_claim(claim, NAMESPACE)
    assert kept.status.phase == "Bound" and kept.metadata.labels["gpusession.workspace"] == ws

    listed = _cli(kube_env, "workspaces")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(f"{ws} ")]
    assert "kubernetes" in row and f"claim {claim} (10Gi, hostpath, Bound)" in row, row

    lines.clear()
    again = m.start(
        m.make_spec("a100", backend="kubernetes", image=numpy_image, name="kws2", idle="off",
                    resume=ws),
        report=lines.append,
    )  # fmt: skip
    assert f"workspace {ws}: claim {claim} (10Gi, hostpath, Bound)" in "\n".join(lines), lines
    assert m.get("kws2").resource["node"] == "n2", "another node mounts the same claim"
    sink = Collect()
    reply = again.run("print(v, arr.sum(), arr.dtype, arr.shape, open('notes.txt').read())", sink)
    assert reply["status"] == "ok", sink.text
    assert sink.text.strip() == "kept 99.0 float64 (3, 4) written in the workspace", sink.text
    with pytest.raises((BadInput, StageError), match=ws):  # one session at a time on a claim
        m.start(m.make_spec("t4", backend="kubernetes", image=numpy_image, name="kws3", resume=ws))
    busy = _cli(kube_env, "workspaces", "rm", ws, "--yes")
    assert busy.returncode == 1 and "in use by session kws2" in busy.stderr, busy.stderr
    m.stop("kws2")

    removed = _cli(kube_env, "workspaces", "rm", ws, "--yes")
    assert removed.returncode == 0 and f"deleted workspace {ws}" in removed.stdout, removed.stderr
    assert claim not in {c.metadata.name for c in _claims(kube, _store(kube_env).store_id)}
    assert f"{ws} " not in _cli(kube_env, "workspaces").stdout


@LANE_2
def test_an_image_remembered_as_root_that_is_not_any_more_ends_its_start_in_one_line(
    kube, kube_env, kube_manager, numpy_image
):
    """A pod of an image last seen running as root has no init container: it prepares its
    claim itself. A tag moved to a non-root image meanwhile finds a folder it cannot write: the
    start ends before any kernel runs, saying what to do, and the next start (the image now
    known) prepares the claim first and its kernel writes there.
    The same moved tag for the runtime's early copy: the Python remembered for the image's name
    is not the one its container has, so nothing is copied early (the copy's check refuses, its
    exec ending at once) and the start probes the image after its status, as a new one's; the
    next start copies early."""
    import json

    from gpusession.backends.kubernetes import podexec, runtime_copy
    from gpusession.backends.kubernetes.runtime_copy import image_user, remember_user
    from support.sinks import Collect

    m, ws = kube_manager, f"wu-{SLOT}"
    # a tag of this test's own: what is remembered of an image is remembered by its name, in the
    # runtime cache every worker shares, and the other lane starts numpy_image meanwhile (it read
    # "root" from here once, and its claim's start ended as this one's must)
    numpy_image = f"{numpy_image.rsplit(':', 1)[0]}:moved-{SLOT}"
    subprocess.run(["docker", "tag", NUMPY, numpy_image], check=True, timeout=60)
    ci_kubernetes("load", numpy_image)
    remember_user(numpy_image, 0)
    moved = "sha256:" + "7" * 64  # what the tag named before it moved: another Python, as root
    probe = runtime_copy.probe_path(moved)
    probe.parent.mkdir(parents=True, exist_ok=True)
    before = {"executable": "/usr/bin/python3", "version": [3, 9, 2], "uid": 0, "ipykernel": "6.29"}
    probe.write_text(json.dumps(dict(before, pip="23.0")))
    runtime_copy.remember_image_id(numpy_image, moved)
    spec = dict(backend="kubernetes", image=numpy_image, idle="off", workspace=ws)
    lines: list[str] = []
    began = time.monotonic()
    with pytest.raises(StageError) as raised:
        m.start(m.make_spec("t4", name="kwu1", **spec), report=lines.append)
    # the copy's refusal read its input out: the exec ended, not held open until its timeout
    # (the start stood two minutes at "its container is being created")
    assert time.monotonic() - began < podexec.EXEC_TIMEOUT, lines
    text = str(raised.value)
    assert "the workspace folder /workspace is not writable by the image user (uid 1000)" in text
    assert "start again" in text and "Traceback" not in text, text
    assert image_user(numpy_image) == 1000
    assert not _ours(kube, store_id=_store(kube_env).store_id), "the failed start left no pod"
    assert not any("as the container started" in line for line in lines), "\n".join(lines)
    assert runtime_copy.EarlyCopy.known(numpy_image, "k").image_id not in ("", moved)

    lines.clear()
    session = m.start(m.make_spec("t4", name="kwu2", **spec), report=lines.append)
    assert any("as the container started" in line for line in lines), "\n".join(lines)
    (pod,) = _ours(kube, m.get("kwu2").id)
    assert [c.name for c in pod.spec.init_containers or []] == ["workspace-owner"]
    sink = Collect()
    cell = "import os\nopen('mine.txt', 'w').write('x')\nprint(os.getuid(), os.getcwd())"
    assert session.run(cell, sink)["status"] == "ok", sink.text
    assert sink.text.strip() == "1000 /workspace", sink.text
    m.stop("kwu2")

    # root remembered where the image's id is right (two starts of a moving tag at once, their
    # writes crossed): the runtime goes in early, unprobed, so the failure's own word on the
    # user is what the next start goes by, as its message says (it failed each time before).
    # A new claim: the one above is the image user's group's now
    remember_user(numpy_image, 0)
    spec["workspace"] = f"wv-{SLOT}"
    lines.clear()
    with pytest.raises(StageError) as raised:
        m.start(m.make_spec("t4", name="kwu3", **spec), report=lines.append)
    assert any("as the container started" in line for line in lines), "\n".join(lines)
    assert "is not writable by the image user (uid 1000): start again" in str(raised.value)
    assert image_user(numpy_image) == 1000
    session = m.start(m.make_spec("t4", name="kwu4", **spec))
    sink = Collect()
    assert session.run(cell, sink)["status"] == "ok", sink.text
    assert sink.text.strip() == "1000 /workspace", sink.text
    m.stop("kwu4")


@LANE_1
def test_an_idle_stop_saves_into_the_claim_and_resume_brings_the_variables_back(
    kube, kube_env, kube_manager
):
    from gpusession.words.stops import ended_message

    m, ws = kube_manager, f"w2-{SLOT}"
    session = m.start(_spec(m, "t4", "kwi1", idle="20s", workspace=ws))
    assert session.run("q = 41\nnames = ['a', 'b']")["status"] == "ok"
    deadline = time.monotonic() + 120
    record = m.get("kwi1")
    while time.monotonic() < deadline and record.state == State.RUNNING:
        time.sleep(2)
        record = m.refresh_state("kwi1")
    assert record.state == State.STOPPED and record.stop_reason.kind is StopKind.IDLE
    said = ended_message(record)
    assert "stopped by its idle watchdog" in said and f"--resume {ws}" in said, said
    assert record.resource["agent_summary"]["checkpoint"]["committed"]
    assert _claims(kube, _store(kube_env).store_id), "the claim outlives the idle pod"

    from support.sinks import Collect

    again, sink = m.start(_spec(m, "t4", "kwi2", idle="off", resume=ws)), Collect()
    assert again.run("print(q + 1, names)", sink)["status"] == "ok"
    assert sink.text.strip() == "42 ['a', 'b']", sink.text
    m.stop("kwi2")


@LANE_1
def test_a_known_images_kernel_is_begun_before_the_runtime_and_is_the_kernel_a_restart_gives(
    kube, kube_manager, product_image
):
    """Issue 33's start: the pod of an image whose Python is known from its last pod begins its
    kernel as the container starts (gpusession.agent.kernelzygote), before the runtime is copied
    in; that kernel is the one a plain spawn gives, as the runtime's own restart shows, and a
    resumed session's restores the workspace's variables."""
    from support import kernelstate
    from support.sinks import Collect

    m, ws = kube_manager, f"wz-{SLOT}"
    m.start(_spec(m, "t4", "kz1", idle="off", image=product_image))  # its Python known from here
    m.stop("kz1")
    session = m.start(_spec(m, "t4", "kz2", idle="off", image=product_image, workspace=ws))

    def state() -> dict:
        sink = Collect()
        assert session.run(kernelstate.CELL, sink)["status"] == "ok", sink.text
        return kernelstate.parse(sink.text)

    begun = state()
    assert begun["cmdline"][1] == "-c", "the kernel begun with the container"
    generation = session.kernel_state()["generation"]
    session.restart_kernel(generation, force=True)
    spawned = state()
    assert spawned["cmdline"][1:3] == ["-m", "ipykernel_launcher"], "a restart spawns"
    assert spawned["pid"] != begun["pid"] and spawned["session_leader"] and begun["session_leader"]
    assert kernelstate.comparable(begun, replace={}) == kernelstate.comparable(spawned, replace={})
    assert session.run("kept = 'from the first pod'")["status"] == "ok"
    m.stop("kz2", save=True)

    # --resume: the kernel begun with the container restores the workspace's variables
    again = m.start(_spec(m, "t4", "kz3", idle="off", image=product_image, resume=ws))
    sink = Collect()
    cell = "print(kept, open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1])"
    assert again.run(cell, sink)["status"] == "ok", sink.text
    assert sink.text.strip() == "from the first pod b'-c'", sink.text
    m.stop("kz3")


@LANE_2
def test_a_claim_of_a_class_that_does_not_exist_gives_up_at_the_queue_timeout_leaving_nothing(
    kube, kube_env, kube_manager
):
    m, ws = kube_manager, f"w3-{SLOT}"
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(StageError) as refused:
        m.start(
            _spec(m, "t4", "kwp", workspace=ws, storage_class=f"gs-none-{SLOT}",
                  queue_timeout="10s"),
            report=lines.append,
        )  # fmt: skip
    said = "\n".join(lines) + "\n" + str(refused.value)
    assert "still waits after 10s (--queue-timeout)" in str(refused.value), said
    assert f'storageclass.storage.k8s.io "gs-none-{SLOT}" not found' in said, said
    assert time.monotonic() - started < 60
    record = m.get("kwp")
    assert record.state == State.FAILED
    assert not _ours(kube, record.id), "the pod is deleted"
    assert not _claims(kube, _store(kube_env).store_id), "the claim this start made is deleted"
    with pytest.raises(
        StageError, match=f"no workspace {ws} in gpusession-ci/{NAMESPACE} to resume"
    ):
        m.start(_spec(m, "t4", "kwr", resume=ws))


SWITCH_CELL = (
    "import numpy as np, os\n"
    "a = np.arange(100_000, dtype='float64')\n"
    "os.makedirs('out', exist_ok=True); open('out/notes.txt', 'w').write('kept')\n"
)


@LANE_1
def test_a_switch_moves_a_session_from_docker_to_kubernetes_and_back_keeping_arrays_and_files(
    kube, kube_env, kube_manager, numpy_image
):
    import docker

    m, ws = kube_manager, f"sw-{SLOT}"
    engine = docker.from_env()
    first = m.start(
        m.make_spec("t4", backend="docker", image=NUMPY, idle="off", name="ksw", workspace=ws)
    )
    try:
        assert first.run(SWITCH_CELL)["status"] == "ok"
        lines: list[str] = []
        there, report = m.switch(
            first, m.switch_spec(first.id, {"backend": "kubernetes", "type": "a100"}), lines.append
        )
        said = "\n".join(lines)
        assert "move: workspace from docker (this machine's engine) to kubernetes" in said, said
        assert f"claim {there.record.resource['claim']}" in said and "move: moved " in said, said
        assert there.record.spec.backend == "kubernetes" and there.record.resource["node"] == "n2"
        assert there.name == "ksw" and m.get(first.id).state == State.STOPPED
        check = "assert float(a.sum()) == 4999950000.0 and open('out/notes.txt').read() == 'kept'"
        assert there.run(check)["status"] == "ok"
        assert (
            there.run("a[:3] = -1\nopen('out/notes.txt', 'w').write('changed in a pod')")["status"]
            == "ok"
        )

        back, report = m.switch(there, m.switch_spec(there.id, {"backend": "docker"}), lines.append)
        assert back.record.spec.backend == "docker" and report.moved_bytes > 800_000
        assert "replacing the older copy of workspace" in "\n".join(lines)
        changed = "assert a[:3].tolist() == [-1.0] * 3 and open('out/notes.txt').read() == 'changed in a pod'"
        assert back.run(changed)["status"] == "ok"
        assert m.get(there.id).state == State.STOPPED and not _ours(kube, there.id)
        m.stop(back.id)
    finally:
        m.stop_all()
        store_id = _store(kube_env).store_id
        for volume in engine.volumes.list(filters={"label": f"{STORE_LABEL}={store_id}"}):
            volume.remove(force=True)
        engine.close()


@LANE_1
def test_a_switch_in_the_cluster_hands_the_claim_over_to_a_pod_on_another_node(kube, kube_manager):
    """ReadWriteOnce: the old session saves and its pod goes before the new pod mounts the
    claim (take_workspace_over), on another node, and the variables and files come back."""
    from support.sinks import Collect

    m, ws = kube_manager, f"sk-{SLOT}"
    first = m.start(_spec(m, "t4", "kswk", idle="off", workspace=ws))
    claim = m.get(first.id).resource["claim"]
    assert first.run("u = 5\nopen('f.txt', 'w').write('here')")["status"] == "ok"
    lines: list[str] = []
    there, _ = m.switch(first, m.switch_spec(first.id, {"type": "a100"}), lines.append)
    record = m.get(there.id)
    assert record.resource["node"] == "n2" and record.resource["claim"] == claim, lines
    sink = Collect()
    assert there.run("print(u, open('f.txt').read())", sink)["status"] == "ok"
    assert sink.text.strip() == "5 here", sink.text
    assert m.get(first.id).state == State.STOPPED and not _ours(kube, first.id)
    m.stop(there.id)


@LANE_2
def test_an_evicted_pod_saves_in_its_grace_and_recover_brings_the_work_back(
    kube, kube_env, numpy_image, tmp_path
):
    """The pod is evicted (the Eviction API, as `kubectl drain` does) while a cell runs: its
    preStop hook has the agent save the namespace (an array too) into the claim within the
    grace, then the kernel ends; the cell says it was cut and is not re-run; the record says
    the cluster took the pod back (its DisruptionTarget condition), with the state saved, read
    from the pod our finalizer kept; --recover (auto: on for a preemption) starts a new pod on
    the claim, which restores, and the next cell runs there with the variables. Nothing is
    left: the old pod goes once read, the new one at the stop."""
    import kubernetes

    from support.notebook_kernel import NotebookKernel

    ws = f"wev-{SLOT}"
    nk = NotebookKernel(kube_env, cwd=str(tmp_path))
    store = _store(kube_env)
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        start = nk.run(
            f"%gpu start --backend kubernetes --type t4 --image {numpy_image} --idle off "
            f"--name kev --workspace {ws}",
            timeout=180,
        )
        assert start.status == "ok", start.text
        made = "import numpy as np\nkept = np.arange(2_000_000, dtype='float64')\nkept.size"
        assert nk.run(f"%%gpu\n{made}").status == "ok"
        first = store.get("kev")
        pod = first.resource["pod"]
        assert _ours(kube, first.id)[0].metadata.finalizers == [
            "gpusession.session/keep-until-read"
        ]

        def busy() -> bool:
            done = subprocess.run(
                [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, "exec", pod, "--",
                 "cat", "/tmp/gpusession/activity.json"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            try:
                return bool(json.loads(done.stdout)["busy"])
            except (ValueError, KeyError):
                return False

        def evict_while_busy() -> None:
            deadline = time.monotonic() + 60
            while not busy() and time.monotonic() < deadline:
                time.sleep(0.2)
            kube.create_namespaced_pod_eviction(
                pod,
                NAMESPACE,
                kubernetes.client.V1Eviction(
                    metadata=kubernetes.client.V1ObjectMeta(name=pod, namespace=NAMESPACE)
                ),
            )

        threading.Thread(target=evict_while_busy, daemon=True).start()
        cut = nk.run("%%gpu\nimport time\nfor i in range(1800):\n    time.sleep(0.1)", timeout=300)
        said = cut.text
        assert cut.status == "error", said
        assert "this cell was interrupted when session kev ended: it is not re-run" in said, said
        assert "recovering session kev: a replacement restores its saved state" in said, said
        assert f"workspace {ws}: restored" in said and "kept" in said, said
        assert "session kev is back: 1 x T4 on kubernetes" in said, said

        old = store.get(first.id)
        assert old.stop_reason.kind is StopKind.PREEMPTED, old.stop_reason
        assert "the Eviction API" in (old.stop_reason.detail or ""), old.stop_reason
        saved = old.resource["agent_summary"]["checkpoint"]
        assert saved["committed"] and saved["for"] == "scheduler-signal", saved
        assert not [p for p in _ours(kube, first.id)], "the old pod goes once its end is read"
        listed = _cli(kube_env, "list", "--all")
        rows = {row.split()[0]: row for row in listed.stdout.splitlines() if row.split()}
        assert "interrupted, state saved" in rows.get("kev~1", ""), listed.stdout

        nxt = nk.run("%%gpu\nprint(kept.sum() == 2_000_000 * 1_999_999 / 2, kept.dtype)")
        assert nxt.status == "ok" and nxt.text.split() == ["True", "float64"], nxt.text
        second = store.get("kev")
        assert second.id != first.id and second.resource["pod"] != pod
        assert nk.run("%gpu stop").status == "ok"
        assert _wait_gone(kube, second.id), "the replacement's pod goes at the stop"
    finally:
        nk.close()


@LANE_2
def test_our_own_stop_saves_nothing_it_was_not_asked_to(kube, kube_env, kube_manager):
    """`stop` without --save deletes the pod too, and its preStop hook runs: our stop marks the
    pod first, so no notice is left and nothing is saved into the claim; the record says who
    stopped it, not the cluster."""
    m, ws = kube_manager, f"wns-{SLOT}"
    session = m.start(_spec(m, "t4", "kns", idle="off", workspace=ws))
    assert session.run("unsaved = 1")["status"] == "ok"
    record = m.get("kns")
    m.stop("kns")
    record = m.get(record.id)
    assert record.state == State.STOPPED and record.stop_reason.kind is StopKind.USER
    assert not (record.resource.get("agent_summary") or {}).get("checkpoint"), record.resource
    assert _wait_gone(kube, record.id)
    again = m.start(_spec(m, "t4", "kns2", idle="off", resume=ws))
    from support.sinks import Collect

    sink = Collect()
    assert again.run("print('unsaved' in globals())", sink)["status"] == "ok"
    assert sink.text.strip() == "False", sink.text
    m.stop("kns2")


@LANE_2
def test_in_a_pod_the_backend_uses_the_pods_own_account(kube, kube_env, accounts, tmp_path):
    """gpusession run inside a pod (as a notebook server under JupyterHub is), with no
    kubeconfig: the in-cluster config (the pod's service account, bound to the documented Role,
    and its namespace) starts a session in that namespace, reaches its kernel through the API
    server's streams, lists and stops it. Its code and packages come from this machine by
    hostPath (the nodes are on it); the API server's address is given as a cluster's
    kube-proxy would route it (the test cluster has none)."""
    import shutil
    import sysconfig

    from gpusession.transport.bundle import ImagePython, cache_dir, site_archive

    namespace = accounts[0].stem  # the kubeconfig is NAMESPACE.kubeconfig
    site = sysconfig.get_paths()["purelib"]
    # the runtime's ipykernel for the image's Python, as this machine has it (the pods have no
    # PyPI): a copy, the pod's own cache (GPUSESSION_CACHE)
    bookworm = ImagePython(
        executable="/usr/bin/python3", version=(3, 11, 2), machine="x86_64",
        libc=("glibc", "2.36"), ipykernel=None, pip=None, uid=0, venv=False,
    )  # fmt: skip
    site_archive(bookworm, cache_dir(), lambda line: None)
    cache = tmp_path / "cache"
    shutil.copytree(cache_dir() / "sites", cache / "runtime" / "sites")
    cache.chmod(0o777)
    script = (
        f"python3 -m gpusession start --backend kubernetes --type t4 --image {IMAGE} "
        "--idle off --name kin && python3 -m gpusession list && "
        "python3 -m gpusession stop kin && python3 -m gpusession list --all"
    )
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notebook-server", "namespace": namespace},
        "spec": {
            "serviceAccountName": "gs",
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": "n2"},
            "containers": [
                {
                    "name": "server",
                    "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/sh", "-c", script],
                    "env": [
                        {"name": "PYTHONPATH", "value": f"/src:{site}"},
                        {"name": "HOME", "value": "/tmp"},
                        {"name": "GPUSESSION_HOME", "value": "/tmp/gs"},
                        {"name": "GPUSESSION_CACHE", "value": "/cache"},
                        {"name": "KUBERNETES_SERVICE_HOST", "value": "10.220.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": "16443"},
                    ],
                    "volumeMounts": [
                        {"name": "src", "mountPath": "/src", "readOnly": True},
                        {"name": "site", "mountPath": site, "readOnly": True},
                        {"name": "cache", "mountPath": "/cache"},
                    ],
                }
            ],
            "volumes": [
                {"name": "src", "hostPath": {"path": str(REPO), "type": "Directory"}},
                {"name": "site", "hostPath": {"path": site, "type": "Directory"}},
                {"name": "cache", "hostPath": {"path": str(cache), "type": "Directory"}},
            ],
        },
    }
    kube.create_namespaced_pod(namespace, body)
    deadline, pod = time.monotonic() + 300, None
    while time.monotonic() < deadline:
        pod = kube.read_namespaced_pod("notebook-server", namespace)
        if pod.status.phase in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    said = kube.read_namespaced_pod_log("notebook-server", namespace)
    assert pod is not None and pod.status.phase == "Succeeded", said[-3000:]
    assert "running: session kin is ready" in said, said[-3000:]
    assert f"(in-cluster)/{namespace}" in said or namespace in said, said[-3000:]
    rows = [
        r
        for r in map(str.split, said.splitlines())
        if r[:1] == ["kin"] and r[2:3] == ["kubernetes"]
    ]
    assert [r[3] for r in rows] == ["running?", "stopped"], said[-3000:]  # list, then list --all
    sessions = kube.list_namespaced_pod(namespace, label_selector=LABEL).items
    assert not sessions, "the session's pod went with its stop"
