"""The kubernetes backend's pure parts: its settings' grammar, the pod it asks for, how a pending
or ended pod is put into words, the launch mark, a refusal in the API's words. The cluster itself:
tests/test_kubernetes.py."""

from __future__ import annotations

import io
import json
import tarfile
from types import SimpleNamespace as NS

import pytest

from gpusession.backends.kubernetes import KubernetesBackend, pods
from gpusession.backends.kubernetes.apiserver import api_words
from gpusession.backends.kubernetes.runtime_copy import launch_archive
from gpusession.core.errors import BadInput
from gpusession.transport.bundle import ImagePython


def test_tolerations_are_written_as_taints_are():
    assert pods.tolerations_setting("nvidia.com/gpu:NoSchedule, dedicated=ml:NoExecute,spot") == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
        {"key": "spot", "operator": "Exists"},
    ]
    with pytest.raises(BadInput, match="KEY\\[=VALUE\\]\\[:EFFECT\\]"):
        pods.tolerations_setting("gpu:Sometimes")


def test_node_selector_and_products_settings():
    assert pods.selector_setting("pool=gpu, zone=a") == {"pool": "gpu", "zone": "a"}
    with pytest.raises(BadInput, match="key=value"):
        pods.selector_setting("pool")
    assert pods.products_setting("") == {}
    assert pods.products_setting('{"a100": "NVIDIA-A100-PCIE-40GB"}') == {
        "a100": "NVIDIA-A100-PCIE-40GB"
    }
    with pytest.raises(BadInput, match="JSON object"):
        pods.products_setting('["a100"]')


def test_a_mig_slice_requests_its_profile_on_its_cards_nodes():
    assert pods.gpu_request("t4", 2, None) == ("nvidia.com/gpu", "t4")
    assert pods.gpu_request("a100-1g.5gb", 1, "a100") == ("nvidia.com/mig-1g.5gb", "a100")
    assert pods.gpu_request("a100-2g.20gb", 1, "a100-80gb") == (
        "nvidia.com/mig-2g.20gb",
        "a100-80gb",
    )


def test_names_and_labels_are_what_kubernetes_takes():
    assert pods.pod_name("My_Run.1", "0123456789abcdef") == "gpusession-my-run-1-01234567"
    assert pods.pod_name("___", "0123456789abcdef") == "gpusession-01234567"
    assert len(pods.pod_name("x" * 100, "0123456789abcdef")) <= 63
    assert pods.label_value("a100:8 run") == "a100-8-run"


def test_the_pod_asks_for_its_gpus_by_model_and_waits_for_its_runtime():
    body = pods.manifest(
        name="gpusession-a-01234567",
        labels={pods.LABEL: "s1"},
        annotations={},
        image="img",
        agent_argv=["--session-id", "s1"],
        session_id="s1",
        resource=("nvidia.com/gpu", 2),
        placement={
            "node_selector": {pods.PRODUCT_LABEL: "Tesla-T4"},
            "tolerations": [],
            "priority_class": "high",
            "service_account": "",
        },
    )
    spec = body["spec"]
    (container,) = spec["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-T4"}
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["priorityClassName"] == "high" and "serviceAccountName" not in spec
    assert container["volumeMounts"] == [
        {"name": pods.RUNTIME_VOLUME, "mountPath": "/opt/gpusession-runtime"}
    ]
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"] and command[-2:] == ["--session-id", "s1"]
    assert "/opt/gpusession-runtime/code/.complete" in command[2] and "boot.sh run" in command[2]
    assert "ports" not in container  # nothing exposed: the kernel is reached by port-forward


def _pod(phase="Pending", conditions=(), containers=(), node=None, reason=None, message=None):
    return NS(
        status=NS(
            phase=phase,
            conditions=list(conditions),
            container_statuses=list(containers),
            reason=reason,
            message=message,
        ),
        spec=NS(node_name=node),
    )


def test_a_pending_pod_is_said_in_the_schedulers_words():
    unscheduled = NS(
        type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match "
        "Pod's node affinity/selector. no new claims to deallocate, preemption: 0/2 nodes are "
        "available: 1 No preemption victims found for incoming pod.",
    )
    assert pods.waiting_reason(_pod(conditions=[unscheduled])) == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's "
        "node affinity/selector.",
        True,
    )
    never = NS(state=NS(waiting=NS(reason="ErrImageNeverPull", message="image not present")))
    assert pods.waiting_reason(_pod(containers=[never], node="n1")) == (
        "ErrImageNeverPull: image not present",
        False,
    )
    creating = NS(state=NS(waiting=NS(reason="ContainerCreating", message=None)))
    assert pods.waiting_reason(_pod(containers=[creating], node="n1"))[1] is True


def test_an_ended_pod_says_how():
    oom = NS(state=NS(terminated=NS(reason="OOMKilled", exit_code=137), waiting=None))
    assert pods.termination(_pod("Failed", containers=[oom])) == ("OOMKilled", 137)
    evicted = _pod("Failed", reason="Evicted", message="The node was low on resource: memory.")
    assert pods.termination(evicted) == ("Evicted: The node was low on resource: memory.", None)
    assert pods.termination(_pod("Running")) == (None, None)


def test_the_launch_mark_comes_last_with_what_the_probe_found():
    python = ImagePython(
        executable="/usr/bin/python3",
        version=(3, 11, 2),
        machine="x86_64",
        libc=("glibc", "2.36"),
        ipykernel=None,
        pip=None,
        uid=0,
        venv=False,
    )
    with tarfile.open(fileobj=io.BytesIO(launch_archive(python))) as tar:
        names = tar.getnames()
        env = tar.extractfile("launch.env").read().decode()
    assert names == ["launch.env", "code/.complete"]
    assert "GPUSESSION_RUNTIME_PYTHON=/usr/bin/python3" in env
    assert "GPUSESSION_RUNTIME_BRINGS=ipykernel,pip" in env


def test_a_refusal_is_the_apis_message():
    status = {"kind": "Status", "message": 'pods "p" is forbidden: User "u" cannot get "pods/exec"'}
    handshake = NS(
        status=0,
        body=None,
        reason=f"Handshake status 403 Forbidden -+-+- {{}} -+-+- {json.dumps(status)}",
    )
    assert api_words(handshake) == status["message"]
    assert (
        api_words(NS(status=403, body=json.dumps(status), reason="Forbidden")) == status["message"]
    )
    assert api_words(NS(status=0, body=None, reason="Connection refused")) == "Connection refused"


def test_its_surface_declares_its_options_settings_and_words():
    names = {o.name for o in KubernetesBackend.start_options}
    assert names == {"context", "namespace", "queue_timeout"}
    assert {s.name for s in KubernetesBackend.settings} >= {
        "image",
        "gpu_products",
        "node_selector",
        "tolerations",
        "priority_class",
        "service_account",
    }
    assert KubernetesBackend.takes_image and KubernetesBackend.default_rank is None
    assert "{detail}" in KubernetesBackend.stop_words["instance-ended"]


def test_without_a_kubeconfig_or_with_an_unknown_context_a_start_says_what_to_do(
    tmp_path, monkeypatch
):
    pytest.importorskip("kubernetes")
    from gpusession.backends.kubernetes import apiserver
    from gpusession.core.errors import BackendUnavailable

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    with pytest.raises(
        BackendUnavailable, match="no kubeconfig to reach a cluster .*set KUBECONFIG"
    ):
        apiserver.cluster(None, None)
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: lab, context: {cluster: c, user: u, namespace: ml}}]\n"
        "current-context: lab\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    with pytest.raises(BackendUnavailable, match=r"no context 'prod' in .*its contexts: lab"):
        apiserver.cluster("prod", None)
    found = apiserver.cluster(None, None)
    assert (found.context, found.namespace, found.server) == ("lab", "ml", "https://127.0.0.1:1")
    assert apiserver.cluster(None, "other").namespace == "other"
