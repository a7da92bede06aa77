"""The Kubernetes test cluster (scripts/ci-kubernetes.sh) for the tests that use it
(tests/test_kubernetes.py, tests/test_kubernetes_browser.py): its files, this worker's namespace,
the lanes, and the session fixtures `kube` and `kube_config` (a plugin: tests/conftest.py names it
in `pytest_plugins`, so each worker makes them once for both modules).

Two lanes. There is one cluster and its GPUs are few (n1: 2 x T4, n2: 1 x A100), and its tests
run on two workers at once (scripts/test.sh), so that neither waits on the other's pods. Each
test is in one of two xdist groups, LANE_1 and LANE_2: a group runs on one worker, one test after
another, and with `--dist loadgroup` on two workers each lane has a worker. The rule that keeps
the lanes out of each other's way, kept by every test: a lane holds at most one T4 at a time
(each test starts its pods one after another), and only lane 1 asks for the A100. So a start
finds the GPU it asks for free whatever the other lane does, and the tests that wait for the
scheduler's reason (a second A100, three T4s) see the one they expect.

A namespace per worker. Each worker's sessions go to a namespace of its own, NAMESPACE (the
current context's in its kubeconfig, `kube_config`): what a test lists or counts there (its
pods, the GPUs they hold on a node, Services) is its own lane's, never the other's."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("GPUSESSION_CI_STATE", "/var/lib/gpusession-ci")) / "kubernetes"
KUBECONFIG = STATE / "admin.kubeconfig"  # the cluster's admin, namespace default
KUBECTL = STATE / "bin" / "kubectl"
SCRIPT = REPO / "scripts" / "ci-kubernetes.sh"
IMAGE = "gpusession-ci/py-bookworm:latest"  # python3 3.11, no ipykernel, no pip
SLOT = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # in names the cluster keeps (claims)
NAMESPACE = f"gs-ci-{SLOT}"  # this worker's sessions, claims and test pods

#: the files that hold every kubernetes test: scripts/test.sh's kubernetes workers collect only them
KUBE_FILES = ("tests/test_kubernetes.py", "tests/test_kubernetes_browser.py")
LANES = ("kubernetes-1", "kubernetes-2")
LANE_1 = pytest.mark.xdist_group(LANES[0])  # the A100's lane (n2), and at most one T4 at a time
LANE_2 = pytest.mark.xdist_group(LANES[1])  # at most one T4 at a time, no A100


def pytest_itemcollected(item):
    """A kubernetes test outside KUBE_FILES would run nowhere in scripts/test.sh (the others' run
    leaves kubernetes tests out, the kubernetes workers collect those files only): said at once,
    in every run that collects it."""
    if item.get_closest_marker("kubernetes") and item.nodeid.split("::")[0] not in KUBE_FILES:
        raise pytest.UsageError(
            f"{item.nodeid}: a kubernetes test outside {', '.join(KUBE_FILES)}; move it, or name "
            "its file in KUBE_FILES (tests/support/kube.py) and scripts/test.sh"
        )


def pytest_runtest_setup(item):
    """A kubernetes test not in exactly one lane could run beside both (and take a GPU a lane
    counts on): said before it runs."""
    if item.get_closest_marker("kubernetes") is None:
        return
    groups = {str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args}
    if len(groups) != 1 or not groups <= set(LANES):
        pytest.fail(
            f"a kubernetes test runs in one lane: mark it LANE_1 or LANE_2 (tests/support/kube.py), "
            f"not {sorted(groups) or 'none'}",
            pytrace=False,
        )


def ci_kubernetes(*args: str) -> None:
    """scripts/ci-kubernetes.sh ARGS (one verb at a time, whoever asks: the script's lock)."""
    done = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"ci-kubernetes.sh {args[0]}: {done.stderr[-2000:]}"


def _namespace_up(api) -> None:
    """NAMESPACE, made when missing (kept: a run's next worker of this slot uses it again; one
    deleted by hand is waited for until it is gone, then made again), once its default service
    account exists (a pod is refused before)."""
    import kubernetes

    deadline = time.monotonic() + 120
    while True:
        try:
            api.create_namespace({"metadata": {"name": NAMESPACE}})
            break
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
        try:
            if api.read_namespace(NAMESPACE).status.phase != "Terminating":
                break
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
        assert time.monotonic() < deadline, f"namespace {NAMESPACE} is still being deleted"
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while True:
        try:
            api.read_namespaced_service_account("default", NAMESPACE)
            return
        except kubernetes.client.ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@pytest.fixture(scope="session")
def kube():
    """The test cluster, up, with IMAGE in both nodes, and this worker's NAMESPACE; the admin's
    CoreV1Api. Skipped only where the cluster's binary was never built (46 minutes fresh:
    docs/testing.md)."""
    if not (STATE / "bin" / "kube").exists():
        pytest.skip(
            f"the Kubernetes test cluster is not built ({STATE}/bin/kube): "
            "scripts/ci-kubernetes.sh build (docs/testing.md, 'Kubernetes test cluster')"
        )
    ci_kubernetes("up")
    ci_kubernetes("load", IMAGE)
    import kubernetes

    api = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(KUBECONFIG))
    )
    _namespace_up(api)
    yield api
    api.api_client.close()


@pytest.fixture(scope="session")
def kube_config(kube, tmp_path_factory) -> Path:
    """This worker's kubeconfig: the admin's, its context's namespace NAMESPACE (what the
    sessions' pods and claims go to, as kubectl's would)."""
    import yaml

    config = yaml.safe_load(KUBECONFIG.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = NAMESPACE
    path = tmp_path_factory.mktemp("kube") / f"{SLOT}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
