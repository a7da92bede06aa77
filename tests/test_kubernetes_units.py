"""The kubernetes backend's pure parts: its settings' grammar, the pod it asks for, how a pending
or ended pod is put into words, the launch mark, a refusal in the API's words. The cluster itself:
tests/test_kubernetes.py."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from gpusession.backends.kubernetes import KubernetesBackend, claims, pods
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
    assert "initContainers" not in spec and "securityContext" not in spec  # no claim, no owner


def _pod(
    phase="Pending", conditions=(), containers=(), node=None, reason=None, message=None, init=()
):
    return NS(
        status=NS(
            phase=phase,
            conditions=list(conditions),
            init_container_statuses=list(init),
            container_statuses=list(containers),
            reason=reason,
            message=message,
        ),
        spec=NS(node_name=node, init_containers=[NS(name="workspace-owner")] if init else None),
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
    # the workspace's init container cannot pull: said, not the session's PodInitializing
    initializing = NS(state=NS(waiting=NS(reason="PodInitializing", message=None)))
    assert pods.waiting_reason(_pod(containers=[initializing], init=[never], node="n1")) == (
        "ErrImageNeverPull: image not present",
        False,
    )


def test_the_early_copy_waits_for_the_init_container_to_end():
    """pods.initialized: the session's container is made after the workspace's owner ended (the
    runtime's early copy begins its tries, and their window, there)."""
    assert pods.initialized(_pod(node="n1"))  # no init container
    creating = NS(state=NS(waiting=NS(reason="PodInitializing", message=None), terminated=None))
    assert not pods.initialized(_pod(node="n1", init=[creating]))
    assert not pods.initialized(_pod(node="n1", init=[NS(state=None)]))
    failed = NS(state=NS(waiting=None, terminated=NS(exit_code=1, reason="Error")))
    assert not pods.initialized(_pod(node="n1", init=[failed]))
    ended = NS(state=NS(waiting=None, terminated=NS(exit_code=0, reason="Completed")))
    assert pods.initialized(_pod(node="n1", init=[ended]))
    unreported = _pod(node="n1", init=[ended])
    unreported.status.init_container_statuses = []  # the kubelet has not said yet
    assert not pods.initialized(unreported)


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
    assert "GPUSESSION_KERNEL_KEY" not in env
    # a start makes the kernel's key and sends it with the runtime: for the container's user alone
    with tarfile.open(fileobj=io.BytesIO(launch_archive(python, "ab" * 32))) as tar:
        member = tar.getmember("launch.env")
        env = tar.extractfile(member).read().decode()
    assert f"export GPUSESSION_KERNEL_KEY={'ab' * 32}" in env and member.mode == 0o600


def test_a_start_knows_its_kernels_connection_from_ready_and_its_own_key():
    from gpusession.backends.kubernetes.backend import _connection

    ports = dict(shell_port=10001, iopub_port=10002, stdin_port=10003, control_port=10004)
    ready = {"ports": {**ports, "hb_port": 10005}, "agent_port": 1234, "ip": "127.0.0.1"}
    info = _connection(ready, "k" * 64)
    assert info == {
        **ports,
        "hb_port": 10005,
        "ip": "127.0.0.1",
        "transport": "tcp",
        "key": "k" * 64,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }
    # another process's start (no key here), or a READY that lacks a port: kernel.json is read
    assert _connection(ready, None) is None
    assert _connection({**ready, "ports": ports}, "k" * 64) is None
    assert _connection({"ports": "x"}, "k" * 64) is None


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
    assert names == {"context", "namespace", "queue_timeout", "workspace_size", "storage_class"}
    assert KubernetesBackend.keeps_workspaces and not KubernetesBackend.shares_workspaces
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


def test_a_workspaces_claim_is_named_after_it_and_its_store_as_kubernetes_takes_names():
    store = "0123456789abcdef"
    assert claims.claim_name("w1", store) == "gpusession-ws-01234567-w1"
    names = {claims.claim_name(n, store) for n in ("W1", "w1", "my_ws", "my-ws", "x" * 63)}
    assert len(names) == 5, "a name changed to fit gets its own hash: no two share a claim"
    for name in names:
        assert len(name) <= 63 and claims._DNS.fullmatch(name) and pods.label_value(name) == name
    assert claims.storage_class(" fast-ssd ") == "fast-ssd"
    with pytest.raises(BadInput, match="bad storage class 'Fast_SSD'.*kubectl get storageclass"):
        claims.storage_class("Fast_SSD")


def test_the_claim_asks_read_write_once_of_its_size_and_class_and_keeps_the_name():
    body = claims.manifest("gpusession-ws-01234567-w1", "W_1", "0123456789abcdef", 10, None)
    assert body["kind"] == "PersistentVolumeClaim"
    assert body["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
    }, "no class named: the cluster's default"
    meta = body["metadata"]
    assert meta["labels"] == {
        "gpusession.workspace": "W_1",
        pods.STORE_LABEL: "0123456789abcdef",
    }
    assert meta["annotations"] == {"gpusession.workspace": "W_1"}
    fast = claims.manifest("c", "w", "s", 50, "fast")
    assert fast["spec"]["storageClassName"] == "fast"
    assert fast["spec"]["resources"]["requests"]["storage"] == "50Gi"


def _claimed_pod(**more):
    """A pod of image "img" with the workspace's claim gpusession-ws-01234567-w1."""
    return pods.manifest(
        name="p",
        labels={},
        annotations={},
        image="img",
        agent_argv=[],
        session_id="s1",
        resource=("nvidia.com/gpu", 1),
        placement={"node_selector": {}, "tolerations": []},
        claim="gpusession-ws-01234567-w1",
        **more,
    )


def test_the_pod_mounts_the_workspaces_claim_where_the_runtime_keeps_the_workspace():
    body = _claimed_pod()
    spec = body["spec"]
    assert {
        "name": "workspace",
        "persistentVolumeClaim": {"claimName": "gpusession-ws-01234567-w1"},
    } in spec["volumes"]
    assert {"name": "workspace", "mountPath": "/workspace"} in spec["containers"][0]["volumeMounts"]
    # an image whose USER is not root writes there too: the folder's group is the pod's fsGroup
    assert spec["securityContext"]["fsGroup"] == pods.WORKSPACE_GID
    (owner,) = spec["initContainers"]
    assert owner["image"] == "img" and owner["securityContext"]["runAsUser"] == 0
    assert f"chgrp {pods.WORKSPACE_GID} /workspace" in owner["command"][2]


def test_a_pod_of_an_image_known_to_run_as_root_has_no_init_container_and_prepares_its_claim():
    """An init container costs a start of its own and the kubelet's notice of its end: an image
    known to run as root gives the workspace to the group itself; any other user meets a folder
    it cannot write with one line that says what to do, before a kernel runs."""
    body = _claimed_pod(owner_first=False)
    spec = body["spec"]
    assert "initContainers" not in spec and spec["securityContext"]["fsGroup"] == 100
    script = spec["containers"][0]["command"][2]
    assert f"chgrp {pods.WORKSPACE_GID} /workspace" in script
    assert "[ ! -w /workspace ]" in script and '"stage":"workspace"' in script
    assert script.index("/workspace") > script.index(".complete")  # after the runtime's copy
    assert "/workspace" not in pods.wait_then_boot(False)  # no claim: nothing of it


def test_a_known_images_pod_begins_its_kernel_as_boot_sh_would_start_the_first_step():
    """The zygote (gpusession.agent.kernelzygote) starts before the runtime's wait, in the
    background, with the environment boot.sh gives the first step (its PYTHONPATH, unbuffered,
    the root), so that the first step's plan matches it; the pod names it to the first step.
    Without a known Python, none. tests/test_kernelzygote.py runs it."""
    from gpusession.core.protocol import ENV_ZYGOTE
    from gpusession.transport.bundle import boot_script

    plain = pods.wait_then_boot(True)
    begun = pods.wait_then_boot(True, "/opt/venv/bin/python3")
    assert "kernelzygote" not in plain and ENV_ZYGOTE not in plain
    assert begun.endswith(plain)  # then the wait for the runtime, as without it
    zygote = begun[: len(begun) - len(plain)]
    assert zygote.startswith("( ") and zygote.endswith(
        f" ) & {ENV_ZYGOTE}=$!; export {ENV_ZYGOTE}; "
    )
    boot = boot_script().decode()
    assert 'PYTHONPATH="$ROOT/code/lib${PYTHONPATH:+:$PYTHONPATH}"' in boot
    assert 'PYTHONPATH="/opt/gpusession-runtime/code/lib${PYTHONPATH:+:$PYTHONPATH}"' in zygote
    assert "PYTHONUNBUFFERED=1" in boot and "PYTHONUNBUFFERED=1" in zygote
    assert "GPUSESSION_RUNTIME_ROOT=/opt/gpusession-runtime" in zygote
    assert "exec /opt/venv/bin/python3 -c " in zygote and "/tmp/gpusession 660 )" in zygote
    assert "export LC_CTYPE=C.UTF-8" in zygote  # as Python's start sets it without a locale


def test_the_zygote_is_for_an_image_whose_kernel_takes_nothing_from_the_bundle(
    tmp_path, monkeypatch
):
    from gpusession.backends.kubernetes import runtime_copy
    from gpusession.transport.bundle import ImagePython

    own = {"executable": "/opt/venv/bin/python3", "version": [3, 11, 2], "uid": 0}
    with_both = ImagePython.from_payload(dict(own, ipykernel="7.4.0", pip="24.0"))
    without = ImagePython.from_payload(dict(own, ipykernel=None, pip="24.0"))
    assert runtime_copy.EarlyCopy("i", "id", with_both, "k").zygote() == "/opt/venv/bin/python3"
    assert runtime_copy.EarlyCopy("i", "id", without, "k").zygote() is None


def test_the_copy_waits_for_ready_and_says_it_or_nothing(monkeypatch):
    """The runtime's copy goes on waiting for its READY file (the start learns READY in that
    exec, not from the log the kubelet serves a relist later): its text, or None without it."""
    from gpusession.backends.kubernetes import backend, podexec

    archives = [(b"c", "/opt/r")]
    ready = '{"ports": {"shell_port": 1}, "ip": "127.0.0.1", "agent_port": 2}'
    seen = {}

    def run(cluster, pod, argv, **kw):
        seen["script"] = argv[2]
        return 0, f"unpacked 1 bytes into /opt/r\nready {ready}\n"

    monkeypatch.setattr(podexec, "run", run)
    said = podexec.send_archives(None, "p", "python3", archives, "it", ready=("/tmp/g/r.json", 5.0))
    assert said == ready and "'/tmp/g/r.json'" in seen["script"]
    assert backend._payload(said)["agent_port"] == 2
    monkeypatch.setattr(podexec, "run", lambda *a, **k: (0, "unpacked 1 bytes into /opt/r\n"))
    assert podexec.send_archives(None, "p", "python3", archives, "it", ready=("/x", 5.0)) is None
    assert backend._payload(None) is None and backend._payload("not json") is None
    assert backend._payload('{"ports": 3}') is None


def test_the_user_an_image_ran_as_is_remembered_by_its_name(tmp_path, monkeypatch):
    from gpusession.backends.kubernetes import runtime_copy
    from gpusession.transport.bundle import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert runtime_copy.image_user("pytorch/pytorch:2.5") is None  # never seen: an init container
    runtime_copy.remember_user("pytorch/pytorch:2.5", 0)
    runtime_copy.remember_user("jupyter/scipy:lab", 1000)
    assert runtime_copy.image_user("pytorch/pytorch:2.5") == 0
    runtime_copy.remember_user("pytorch/pytorch:2.5", 1000)  # the tag moved to a non-root image
    assert runtime_copy.image_user("pytorch/pytorch:2.5") == 1000
    assert runtime_copy.image_user("jupyter/scipy:lab") == 1000
    path = runtime_copy._users_path()  # beside it, its lock (runtime_copy._remember)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".lock"]
    path.write_text("not json")
    assert runtime_copy.image_user("jupyter/scipy:lab") is None  # a damaged file: unknown
    runtime_copy.remember_user("jupyter/scipy:lab", 0)
    assert runtime_copy.image_user("jupyter/scipy:lab") == 0


def test_the_early_copy_knows_an_images_python_by_its_name(tmp_path, monkeypatch):
    """EarlyCopy: the Python of the last pod of an image's name (its id, then that id's probe);
    what the copy's script checks of that Python: the next test."""
    import sys

    from gpusession.backends.kubernetes import runtime_copy
    from gpusession.transport.bundle import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert runtime_copy.EarlyCopy.known("numpy:1", "key") is None  # never seen
    runtime_copy.remember_image_id("numpy:1", "sha256:" + "a" * 64)
    assert runtime_copy.EarlyCopy.known("numpy:1", "key") is None  # no probe of that id here
    probe = runtime_copy.probe_path("sha256:" + "a" * 64)
    payload = {"executable": sys.executable, "version": list(sys.version_info[:3]), "uid": 0}
    probe.write_text(json.dumps(payload))
    early = runtime_copy.EarlyCopy.known("numpy:1", "key")
    assert early is not None and early.python.executable == sys.executable
    assert early.image_id == "sha256:" + "a" * 64 and not early.done


def _this_python() -> dict:
    import importlib.util
    import os
    import sys

    have = {"version": list(sys.version_info[:3]), "uid": os.getuid()}
    have.update(
        ipykernel=importlib.util.find_spec("ipykernel") is not None,
        pip=importlib.util.find_spec("pip") is not None,
    )
    return have


def _small_files() -> None:
    """In a test's child: files grow to 1 MB at most (a claim that is full: EFBIG, not a signal)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def _fed(argv: list[str], data: bytes, small_files: bool = False):
    """`argv` run with `data` on its stdin, written whole before its end is read, as the exec
    stream writes it: (exit status, stdout and stderr). A script that ends with its input unread
    fails this (BrokenPipeError): in a pod the node then holds the exec open (two minutes)."""
    import subprocess

    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_small_files if small_files else None,
    )
    try:
        proc.stdin.write(data)  # more than a pipe holds: written only as the script reads it
        proc.stdin.close()
        return proc.wait(60), proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tar(name: str, content: bytes, mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


@pytest.mark.integration  # runs the script with python, as the pod does
def test_the_copys_check_refuses_another_python_and_reads_its_input_out(tmp_path):
    """The copy's script checks first that the image's Python is the one probed in its last pod
    (a tag may have moved): where it is not, exit 3 with nothing unpacked, its input read to the
    end all the same (a loaded CI run: the exec then stayed open two minutes, past the test's
    limit); where it is, the archives are unpacked, in order."""
    import sys

    from gpusession.backends.kubernetes import podexec

    have = _this_python()
    archives = [
        (_tar("big.bin", b"\1" * (3 << 20)), tmp_path / "a"),
        (_tar("x", b"x"), tmp_path / "b"),
    ]
    args = [a for data, folder in archives for a in (str(folder), str(len(data)))]
    data = b"".join(d for d, _ in archives)
    moved = podexec.copy_script(dict(have, version=[3, 9, 2]))
    status, said = _fed([sys.executable, "-c", moved, *args], data)
    assert status == podexec.NOT_PROBED, said
    assert "not the Python probed in this image's last pod" in said
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    status, said = _fed([sys.executable, "-c", podexec.copy_script(have), *args], data)
    assert status == 0 and said.count("unpacked ") == 2, said
    assert (tmp_path / "a" / "big.bin").stat().st_size == 3 << 20
    assert (tmp_path / "b" / "x").read_bytes() == b"x"


@pytest.mark.integration  # runs the script with python, as the pod does
def test_a_copy_the_pod_cannot_write_says_why_and_reads_its_input_out(tmp_path):
    """A full disk in the pod (files held to 1 MB here): the first archive's unpacking fails, the
    script says where and why, and reads the rest of its input before it ends."""
    import sys

    from gpusession.backends.kubernetes import podexec

    archives = [
        (_tar("big.bin", b"\1" * (2 << 20)), tmp_path / "a"),
        (b"\0" * (4 << 20), tmp_path / "b"),
    ]
    args = [a for data, folder in archives for a in (str(folder), str(len(data)))]
    data = b"".join(d for d, _ in archives)
    status, said = _fed(
        [sys.executable, "-c", podexec.copy_script(), *args], data, small_files=True
    )
    assert status == 1, said
    assert f"unpacking into {tmp_path / 'a'} failed: [Errno 27] File too large" in said, said
    assert "unpacked" not in said and not (tmp_path / "b").exists()


def _claimed(session, phase, claim):
    volume = NS(persistent_volume_claim=NS(claim_name=claim))
    return NS(
        metadata=NS(name=f"pod-{session}", labels={pods.LABEL: session}),
        status=NS(phase=phase),
        spec=NS(volumes=[NS(persistent_volume_claim=None), volume]),
    )


def test_a_claim_is_in_use_by_the_pods_not_ended_that_mount_it():
    listed = [
        _claimed("a", "Running", "c1"),
        _claimed("b", "Succeeded", "c1"),
        _claimed("c", "Pending", "c2"),
        _claimed("d", "Pending", "c1"),
    ]
    assert [p.metadata.name for p in claims.mounted_by(listed, "c1")] == ["pod-a", "pod-d"]
    assert claims.mounted_by(listed, "c3") == []


def test_a_listed_claim_says_its_size_class_and_state():
    pytest.importorskip("kubernetes")
    claim = NS(
        metadata=NS(
            name="gpusession-ws-01234567-w1",
            labels={"gpusession.workspace": "w1"},
            annotations={"gpusession.workspace": "w1"},
        ),
        spec=NS(resources=NS(requests={"storage": "10Gi"}), storage_class_name="hostpath"),
        status=NS(phase="Bound", capacity={"storage": "10Gi"}),
    )
    cluster = NS(context="ci", namespace="default")
    ws = claims._workspace(
        "kubernetes", cluster, claim, [_claimed("s1", "Running", claim.metadata.name)]
    )
    assert ws.name == "w1" and ws.size_bytes == 10 * 2**30 and ws.in_use_by == ["s1"]
    assert ws.where == "claim gpusession-ws-01234567-w1 (10Gi, hostpath, Bound) in ci/default"
    assert ws.details == {"context": "ci", "namespace": "default", "claim": claim.metadata.name}


def _script(text: str, root) -> str:
    return text.replace("'/workspace'", repr(str(root)))


@pytest.mark.integration  # runs the scripts with python, as the pods do
def test_a_workspace_read_out_of_a_pod_and_written_into_another_claim_replaces_it_whole(tmp_path):
    """The scripts the pods run for a switch (claim_moves.py), here on folders: the tar has the
    workspace under `workspace/`; writing it replaces what the claim held, but only once the
    whole tar came: a short one leaves the older copy as it was, and so does a claim that takes
    no more (files held to 1 MB here), which reads its input to the end all the same (an exec
    that ends with its input unread is held open: the move would wait IMPORT_TIMEOUT_S)."""
    import subprocess
    import sys

    from gpusession.backends.kubernetes import claim_moves

    source, dest = tmp_path / "source", tmp_path / "dest"
    (source / "sub").mkdir(parents=True)
    (source / "notes.txt").write_text("kept")
    (source / "sub" / "a.bin").write_bytes(b"\0" * 1000)
    data = subprocess.run(
        [sys.executable, "-c", _script(claim_moves.EXPORT, source)], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames()[0] == "workspace" and "workspace/sub/a.bin" in tar.getnames()
    dest.mkdir()
    (dest / "old.txt").write_text("an older copy")
    fill = ["/bin/sh", "-c", claim_moves._python(""), claim_moves.IMPORT, str(dest)]
    short = subprocess.run([*fill, str(len(data))], input=data[:-100], capture_output=True)
    assert short.returncode != 0 and b"arrived short" in short.stderr
    assert [p.name for p in dest.iterdir()] == ["old.txt"], "nothing half-written is left"
    assert (dest / "old.txt").read_text() == "an older copy"
    full = _fed([*fill, str(len(data) + (4 << 20))], data + b"\0" * (4 << 20), small_files=True)
    assert full[0] != 0 and "the claim did not take the workspace: [Errno 27]" in full[1], full
    assert [p.name for p in dest.iterdir()] == ["old.txt"], "a full claim keeps the older copy"
    # small as it comes, 2 MB once unpacked: the claim fills as it unpacks
    packed = _tar("workspace/big.bin", b"\0" * (2 << 20), mode="w:gz")
    full = _fed([*fill, str(len(packed))], packed, small_files=True)
    assert full[0] != 0 and "the claim did not take the workspace: [Errno 27]" in full[1], full
    assert "Traceback" not in full[1], full
    assert [p.name for p in dest.iterdir()] == ["old.txt"], "nothing half-unpacked is left"
    whole = subprocess.run([*fill, str(len(data))], input=data, capture_output=True, check=True)
    assert b"workspace in" in whole.stdout
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt", "sub"]
    assert (dest / "notes.txt").read_text() == "kept"
    assert (dest / "sub" / "a.bin").read_bytes() == b"\0" * 1000


def test_the_helper_that_fills_a_claim_mounts_it_as_root_without_a_gpu():
    from gpusession.backends.kubernetes import claim_moves

    body = claim_moves.helper_manifest(
        "h", {pods.LABEL: "s1"}, "img", "c1", {"node_selector": {}, "tolerations": []}
    )
    spec = body["spec"]
    (container,) = spec["containers"]
    assert container["name"] == pods.CONTAINER and container["resources"] == {}
    assert container["securityContext"]["runAsUser"] == 0
    assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace"}]
    assert spec["volumes"] == [{"name": "workspace", "persistentVolumeClaim": {"claimName": "c1"}}]
    assert body["metadata"]["labels"] == {pods.LABEL: "s1"}, "its session's stop removes it"


# -- when the cluster takes the pod back ----------------------------------------------------


def test_the_pod_is_kept_until_read_and_its_hook_has_the_agent_save_within_its_grace():
    body = pods.manifest(
        name="p",
        labels={},
        annotations={},
        image="img",
        agent_argv=["--session-id", "s1"],
        session_id="s1",
        resource=("nvidia.com/gpu", 1),
        placement={"node_selector": {}, "tolerations": []},
    )
    assert body["metadata"]["finalizers"] == [pods.FINALIZER]
    spec, container = body["spec"], body["spec"]["containers"][0]
    assert spec["terminationGracePeriodSeconds"] == pods.GRACE_S > pods.PRESTOP_WAIT_S
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and "scheduler-signal.json" in hook[2]
    assert container["terminationMessagePath"] == pods.TERMINATION_LOG
    from gpusession.core.protocol import NOTICE_SAVE_S

    assert pods.PRESTOP_WAIT_S > NOTICE_SAVE_S  # the hook outwaits the agent's bounded save


def _hook(tmp_path, monkeypatch) -> tuple[str, Path]:
    state = tmp_path / "state"
    monkeypatch.setattr(pods, "STATE_DIR", str(state))
    monkeypatch.setattr(pods, "NOTICES", str(state / "notices"))
    monkeypatch.setattr(pods, "PRESTOP_WAIT_S", 3)
    return pods.pre_stop(), state


def test_the_hook_leaves_a_notice_and_waits_for_the_agents_answer(tmp_path, monkeypatch):
    """The hook, run by sh as the kubelet runs it, against the agent's own NoticeWatcher: the
    notice appears, the agent answers (NAME.done), the hook returns only after that."""
    import subprocess
    import threading
    import time

    from gpusession.agent.notices import NoticeWatcher
    from gpusession.core.protocol import Notice

    script, state = _hook(tmp_path, monkeypatch)
    state.mkdir()
    (state / "kernel.json").write_text("{}")
    answered: list = []

    def save(kind, notice):
        time.sleep(1.0)  # a save that takes a while
        answered.append((kind, notice, time.monotonic()))

    watcher = NoticeWatcher(str(state / "notices"), save, interval_s=0.1)
    threading.Thread(target=watcher.run, daemon=True).start()
    try:
        subprocess.run(["/bin/sh", "-c", script], check=True, timeout=10)
        returned = time.monotonic()
    finally:
        watcher.close()
    assert answered and answered[0][0] is Notice.SCHEDULER_SIGNAL
    assert answered[0][1] == {"signal": "TERM", "by": "kubernetes"}
    assert answered[0][2] <= returned  # the SIGTERM comes after the save


def test_the_hook_leaves_nothing_at_our_own_stop_or_before_the_kernel(tmp_path, monkeypatch):
    import subprocess

    script, state = _hook(tmp_path, monkeypatch)
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=5)  # no kernel yet
    assert not (state / "notices").exists()
    (state / "notices").mkdir(parents=True)
    (state / "kernel.json").write_text("{}")
    (state / "notices" / pods.STOPPING).write_text("")
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=5)
    assert sorted(p.name for p in (state / "notices").iterdir()) == [pods.STOPPING]


def test_the_hook_gives_up_waiting_within_its_bound(tmp_path, monkeypatch):
    import subprocess
    import time

    script, state = _hook(tmp_path, monkeypatch)
    state.mkdir()
    (state / "kernel.json").write_text("{}")
    started = time.monotonic()
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=15)  # no agent answers
    assert 2.5 < time.monotonic() - started < 12
    assert (state / "notices" / "scheduler-signal.json").exists()


def _ended(conditions=(), message=None, phase="Failed", reason=None):
    terminated = NS(reason="Error", exit_code=143, message=message)
    return _pod(
        phase=phase,
        conditions=conditions,
        containers=[NS(state=NS(terminated=terminated, waiting=None))],
        reason=reason,
    )


def test_a_pod_the_cluster_took_back_is_recorded_as_preempted_with_the_agents_save():
    from gpusession.core.protocol import StopDetails, StopKind, StopReason

    evicted = NS(
        type="DisruptionTarget",
        status="True",
        reason="EvictionByEvictionAPI",
        message="Eviction API: evicting",
    )
    brief = json.dumps(
        {
            "reason": {"kind": "signal", "signal": 15},
            "at": 1700000000.5,
            "summary": {"checkpoint": {"committed": True, "for": "scheduler-signal"}},
        }
    )
    pod = _ended([evicted], message=brief)
    own = pods.termination_brief(pod)
    assert own.reason.kind is StopKind.SIGNAL and own.summary["checkpoint"]["committed"]
    told = pods.ended_by_cluster(pod, own)
    assert told.reason.kind is StopKind.PREEMPTED
    assert told.reason.detail == (
        "evicted (the Eviction API: a drained node, kubectl drain): Eviction API: evicting"
    )
    assert told.summary["checkpoint"]["for"] == "scheduler-signal" and told.at == 1700000000.5
    # a stop the agent decided stays its own; a pod nobody took back is left as it was
    idle = StopDetails(reason=StopReason(StopKind.IDLE, idle_for_s=20))
    assert pods.ended_by_cluster(pod, idle) is idle
    assert pods.ended_by_cluster(_ended(), own) is own
    # a kubelet's eviction (no condition, the pod's own reason) and a brief that is not JSON
    kubelet = _ended(reason="Evicted", message="not json")
    kubelet.status.message = "The node was low on resource: memory."
    assert pods.disruption(kubelet) == (
        "evicted by its node's kubelet: The node was low on resource: memory."
    )
    assert pods.termination_brief(kubelet).reason is None
    said = KubernetesBackend.stop_words["preempted"].format(detail="x")
    assert said == "the cluster took its pod back: x"


def test_the_agents_brief_fits_the_termination_message(tmp_path):
    from gpusession.agent.service import BRIEF_BYTES, _write_brief

    path = tmp_path / "termination-log"
    checkpoint = {
        "committed": True,
        "for": "scheduler-signal",
        "saved": 3,
        "skipped": [{"name": f"v{i}", "why": "x" * 50} for i in range(200)],
    }
    stopped = {"reason": {"kind": "signal", "signal": 15}, "at": 5.0}
    _write_brief(str(path), stopped, {"checkpoint": checkpoint, "usage": {"x": "y" * 9000}})
    text = path.read_text()
    assert len(text.encode()) <= BRIEF_BYTES
    brief = json.loads(text)
    assert brief["reason"]["kind"] == "signal"
    assert brief["summary"]["checkpoint"] == {
        "committed": True,
        "for": "scheduler-signal",
        "saved": 3,
    }


# -- the port-forward relay ----------------------------------------------------------------


class _FakeWebsocket:
    """The API server's side of one port-forward stream: `frames` queued (each made readable by
    one byte on a socket pair, as select sees a websocket), what the relay sends kept."""

    def __init__(self, frames: list[bytes]):
        import socket

        self._ready, self._feed = socket.socketpair()
        self.frames, self.connected, self.sent = list(frames), True, bytearray()
        self._feed.sendall(b"x" * len(self.frames))
        self.sock = NS(send=self._send)  # what the relay writes to the API server

    def _send(self, data) -> int:
        self.sent += data
        return len(data)

    def fileno(self) -> int:
        return self._ready.fileno()

    def recv_data_frame(self, _control: bool):
        from websocket import WebSocketConnectionClosedException

        if not self.frames:
            self.connected = False
            raise WebSocketConnectionClosedException("closed")
        self._ready.recv(1)
        if len(self.frames) == 1:
            self._feed.sendall(b"x")  # the close comes next
        return 0x2, NS(data=self.frames.pop(0))

    def close(self) -> None:
        self.connected = False


def test_the_relay_hands_a_download_over_whole_and_in_order_holding_a_bounded_backlog():
    """A stream that sends faster than the local side reads (a download into a busy kernel): the
    relay delivers every byte once, in order, and while the local side lags it holds at most its
    limit and one frame (the client's loop copied its whole backlog at every send)."""
    import hashlib
    import os
    import threading

    from gpusession.backends.kubernetes import relay

    socket_pair = __import__("socket").socketpair
    local, python = socket_pair()
    port = NS(python=python, channel=b"\x00", port_number=5000, error=None)
    opening = [b"\x00" + (5000).to_bytes(2, "little"), b"\x01" + (5000).to_bytes(2, "little")]
    chunks = [os.urandom(256 * 1024) for _ in range(64)]  # 16 MB
    ws = _FakeWebsocket(opening + [b"\x00" + c for c in chunks])
    got = bytearray()

    def read_slowly() -> None:
        while True:
            data = local.recv(64 * 1024)
            if not data:
                return
            got.extend(data)

    reader = threading.Thread(target=read_slowly, daemon=True)
    reader.start()
    result = relay.relay(ws, [port], limit=1024 * 1024)
    reader.join(10)
    assert hashlib.sha256(got).digest() == hashlib.sha256(b"".join(chunks)).digest()
    assert result["most_waiting"] <= 1024 * 1024 + 256 * 1024 + 1
    local.close()


def test_the_relay_frames_what_the_local_side_sends_and_says_the_error_channel():
    import socket

    from gpusession.backends.kubernetes import relay

    local, python = socket.socketpair()
    port = NS(python=python, channel=b"\x00", port_number=7, error=None)
    opening = [b"\x00\x07\x00", b"\x01\x07\x00"]
    ws = _FakeWebsocket(opening + [b"\x01unable to forward: connection refused"])
    local.sendall(b"hello")
    relay.relay(ws, [port])
    assert port.error == "unable to forward: connection refused"
    frame = bytes(ws.sent)  # one masked binary frame, as a client sends: the data channel's
    assert frame[0] == 0x82 and frame[1] == 0x80 | 6
    mask, payload = frame[2:6], frame[6:12]
    assert bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) == b"\x00hello"
    local.close()


def test_a_copy_whose_every_archive_unpacked_is_done_even_when_its_exit_code_was_lost(
    monkeypatch,
):
    """The last archive lets the pod's container go on; one that ends at once (a workspace it
    cannot write) cuts the exec stream before its exit code comes. Every archive said unpacked:
    the copy is done, and the start's next stage says the pod's reason. One short of that is
    the copy's failure, said with its last lines."""
    from gpusession.backends.kubernetes import podexec
    from gpusession.core.errors import StageError

    archives = [(b"a", "/opt/r/site"), (b"b", "/opt/r/code"), (b"c", "/opt/r")]
    said = "".join(f"unpacked 1 bytes into {folder}\n" for _, folder in archives)
    monkeypatch.setattr(podexec, "run", lambda *a, **k: (1, said))
    podexec.send_archives(None, "p", "python3", archives, "the runtime")  # no error
    monkeypatch.setattr(podexec, "run", lambda *a, **k: (1, said.rsplit("unpacked", 1)[0]))
    with pytest.raises(StageError) as raised:
        podexec.send_archives(None, "p", "python3", archives, "the runtime")
    assert "copying the runtime into pod p failed (exit 1): unpacked 1 bytes into" in str(
        raised.value
    )


_REMEMBER = """
import sys
from gpusession.backends.kubernetes.runtime_copy import remember_image_id
for n in range(int(sys.argv[2])):
    remember_image_id(f"{sys.argv[1]}-{n}", f"sha256:{n}")
"""


@pytest.mark.integration
def test_two_processes_remembering_images_at_once_keep_every_one(tmp_path, monkeypatch):
    """The map of image names to ids is shared by every process of the user (the two kubernetes
    lanes of CI wrote it at once, and one's read-then-write dropped the other's image, which
    its next start took for a new one): each keeps its own."""
    import os
    import subprocess
    import sys

    from gpusession.backends.kubernetes import runtime_copy

    env = dict(os.environ, GPUSESSION_CACHE=str(tmp_path))
    writers = [
        subprocess.Popen([sys.executable, "-c", _REMEMBER, name, "150"], env=env)
        for name in ("a", "b", "c")
    ]
    assert [w.wait(120) for w in writers] == [0, 0, 0]
    monkeypatch.setenv("GPUSESSION_CACHE", str(tmp_path))
    known = runtime_copy._known_ids()
    assert len(known) == 450 and known["b-149"] == "sha256:149"
