"""Pure parts of the aws backend: the boot plan, the address map, the order of attempts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gpusession.backends.aws.launch import Attempt, Subnet, attempts, fallback_mode
from gpusession.backends.aws.teardown import console_details, ended_reason
from gpusession.backends.base import stop_details_from_log
from gpusession.backends.cloudvm.cloudinit import (
    BootPlan,
    access_script,
    authorized_key_line,
    boot_script,
    new_host_key,
    user_data,
)
from gpusession.backends.cloudvm.link import map_address
from gpusession.core.errors import BadInput
from gpusession.core.protocol import (
    ENV_KERNEL_KEY,
    ENV_SESSION_ID,
    Marker,
    StopDetails,
    StopKind,
    StopReason,
    find_markers,
    marker_line,
)
from gpusession.transport.bundle import boot_script as bundle_boot_script

A, B, C = (Subnet(f"subnet-{z}", f"us-east-1{z}", "vpc-1") for z in "abc")


def plan(spot=False):
    return BootPlan(
        "0123456789abcdef0123456789abcdef",
        "registry.example/gpusession:1",
        "ssh-ed25519 AAAAkey s",
        new_host_key("host"),
        "ab" * 32,
        ["--idle", "1800", "--price-per-hour", "0.5"],
        spot=spot,
    )


def test_user_data_fits_and_script_is_valid_shell():
    for spot in (False, True):
        text = user_data(plan(spot))
        assert text.startswith("#cloud-config\n") and len(text.encode()) < 16 * 1024
        subprocess.run(["sh", "-n"], input=boot_script(plan(spot)), text=True, check=True)
        subprocess.run(["sh", "-n"], input=access_script(plan(spot)), text=True, check=True)
    script = boot_script(plan(True))
    assert "\nset -- --idle 1800 --price-per-hour 0.5\n" in script  # the agent's options, as words
    assert "\nSPOT=1\n" in script and "SPOT=0" in boot_script(plan(False)) and "poweroff" in script
    assert (
        "--network host" in script and "--gpus all" in script and "-p 127" not in script
    )  # nothing published


def test_session_key_may_only_reach_the_kernel_sockets_the_agent_port_and_access_sh():
    line = authorized_key_line(plan())
    folder = "/var/lib/gpusession/0123456789abcdef0123456789abcdef"
    opens = ",".join(
        f'permitopen="{where}"'
        for where in (
            *(f"[{folder}/kernel/k-{i}]:*" for i in (1, 2, 3, 4, 5, "r")),  # r: the raw stream
            "127.0.0.1:50010",
        )
    )
    assert (
        line
        == f'restrict,port-forwarding,{opens},command="sh {folder}/access.sh" ssh-ed25519 AAAAkey s'
    )
    # the boot script puts the kernel there, in a folder of the login's group the container gets
    script = boot_script(plan())
    assert f"\nSOCKETS={folder}/kernel\n" in script and "\nLOGIN=gpusession\n" in script
    assert '-v "$SOCKETS:$SOCKETS"' in script and '--group-add "$gid"' in script
    from gpusession.backends.cloudvm.cloudinit import (
        instance_sockets,
    )  # the runtime's --kernel-ip (AgentArgs)

    assert instance_sockets("0123456789abcdef0123456789abcdef") == f"{folder}/kernel"


def test_the_link_reaches_the_kernel_where_the_session_says(tmp_path):
    from gpusession.backends.cloudvm.link import kernel_info

    (tmp_path / "key").write_text("k" * 64)
    res = {"kernel_key_path": str(tmp_path / "key")}
    info = kernel_info({**res, "sockets": "/var/lib/gpusession/s/kernel"})
    assert (info["transport"], info["ip"], info["shell_port"], info["hb_port"]) == (
        "ipc",
        "/var/lib/gpusession/s/kernel/k",
        1,
        5,
    )
    # a session started by an earlier gpusession: the loopback ports its instance listens on
    info = kernel_info(res)
    assert (info["transport"], info["ip"], info["shell_port"], info["key"]) == (
        "tcp",
        "127.0.0.1",
        50001,
        "k" * 64,
    )


def test_access_sh_answers_status_takes_the_bundle_and_refuses_the_rest(tmp_path):
    script = access_script(plan()).replace(
        "DIR=/var/lib/gpusession/0123456789abcdef0123456789abcdef", f"DIR={tmp_path}"
    )
    (tmp_path / "upload").mkdir()
    (tmp_path / "status").write_text("GPUSESSION_BOOT starting x\n")
    (tmp_path / "pull.log").write_text(
        '{"status":"Downloading","id":"a","progressDetail":{"current":1,"total":9}}\n'
        '{"status":"Pull complete","id":"a"}\n{"status":"Waiting","id":"b"}\n'
    )

    def access(command, data=b""):
        return subprocess.run(
            ["sh", "-c", script],
            input=data,
            env={"SSH_ORIGINAL_COMMAND": command, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=30,
        )

    out = access("status").stdout.decode().splitlines()
    assert out[0] == "GPUSESSION_BOOT starting x"
    assert sorted(out[1:]) == [
        '{"status":"Pull complete","id":"a"}',
        '{"status":"Waiting","id":"b"}',
    ]  # last per layer
    import hashlib

    good = b"bundle bytes"
    assert (
        access(f"put code {hashlib.sha256(b'other').hexdigest()}", good).returncode == 1
    )  # damaged: refused
    assert not (tmp_path / "upload" / "code.tgz").exists()
    assert access(f"put code {hashlib.sha256(good).hexdigest()}", good).returncode == 0
    assert (tmp_path / "upload" / "code.tgz").read_bytes() == good
    assert access("put ../x 00", good).returncode == 2
    assert access("cat /etc/passwd").returncode == 2 and access("notice").returncode != 0


def test_address_map(monkeypatch):
    monkeypatch.delenv("GPUSESSION_AWS_ADDRESS_MAP", raising=False)
    assert map_address("54.1.2.3") == ("54.1.2.3", 22)
    monkeypatch.setenv("GPUSESSION_AWS_ADDRESS_MAP", "54.1.2.3=10.201.0.2, *=127.0.0.1:2200")
    assert map_address("54.1.2.3") == ("10.201.0.2", 22)
    assert map_address("3.3.3.3") == ("127.0.0.1", 2200)


def describe(plan_):
    return [(a.spot, a.subnet.zone[-1]) for a in plan_]


def test_attempts_follow_the_fallback_the_user_allowed():
    prices = {"us-east-1a": 0.3, "us-east-1b": 0.2, "us-east-1c": 0.25}
    zones = [A, B, C]
    assert describe(attempts(True, "off", zones, prices)) == [(True, "b")]  # cheapest zone first
    assert describe(attempts(True, "zone", zones, prices)) == [
        (True, "b"),
        (True, "c"),
        (True, "a"),
    ]
    assert describe(attempts(True, "on-demand", zones, prices)) == [(True, "b"), (False, "b")]
    assert describe(attempts(True, "any", zones, prices)) == [
        (True, "b"),
        (True, "c"),
        (True, "a"),
        (False, "b"),
        (False, "c"),
        (False, "a"),
    ]
    assert describe(attempts(False, "off", zones, {})) == [(False, "a")]
    assert describe(attempts(False, "any", zones, {})) == [(False, "a"), (False, "b"), (False, "c")]
    assert Attempt(True, A).describe("g5.xlarge") == "g5.xlarge spot in us-east-1a"
    with pytest.raises(BadInput, match="use one of off, zone, on-demand, any"):
        fallback_mode({"fallback": "sometimes"})


def _boot(tmp_path, docker: str) -> str:
    """The boot script's output with a fake docker (shell text) and no real machine."""
    script = boot_script(plan())
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    for tool, text in (
        ("docker", docker),
        ("poweroff", ""),
        ("seq", ""),
        ("curl", "exit 7"),
        ("sleep", ""),
    ):
        (fake_bin / tool).write_text(f"#!/bin/sh\n{text}\n")
        (fake_bin / tool).chmod(0o755)
    folder = tmp_path / "machine"
    folder.mkdir()
    (folder / "boot.sh").write_bytes(bundle_boot_script())
    script = script.replace(
        "DIR=/var/lib/gpusession/0123456789abcdef0123456789abcdef", f"DIR={folder}"
    )
    script = script.replace("RUNTIME_WAIT_S=600", "RUNTIME_WAIT_S=2").replace(
        "/dev/console", f"{tmp_path}/console"
    )
    script = script.replace(  # never this machine's own sysctl
        "RESERVED_PORTS=/proc/sys/net/ipv4/ip_local_reserved_ports",
        f"RESERVED_PORTS={tmp_path}/reserved_ports",
    )
    (tmp_path / "console").touch()
    out = subprocess.run(
        ["sh", "-c", script],
        env={"PATH": f"{fake_bin}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert out.rstrip().endswith(Marker.POWEROFF.value)
    assert (tmp_path / "console").read_text() == out  # what EC2's console output keeps
    assert (folder / "status").read_text() == out  # what access.sh status shows the client
    return out


def test_the_boot_script_speaks_the_protocol(tmp_path):
    """Its markers and environment names come from gpusession.core.protocol; a failed pull leaves a
    FAILED marker whose payload parses."""
    script = boot_script(plan())
    for name in (ENV_SESSION_ID, ENV_KERNEL_KEY):
        assert f"-e {name}" in script or f'-e "{name}=' in script
    out = _boot(tmp_path, "exit 1")
    assert find_markers(out, Marker.BOOT) == [
        "starting registry.example/gpusession:1",
        "pulling registry.example/gpusession:1",
    ]
    (failed,) = find_markers(out, Marker.FAILED)
    assert failed == {"stage": "image", "error": "cannot pull registry.example/gpusession:1"}
    assert stop_details_from_log(out).reason.kind == StopKind.START_FAILED


def test_the_boot_script_takes_the_agents_port_out_of_the_ephemeral_range(tmp_path):
    """Before anything connects to it: a refused connect through the tunnel that got the agent's
    port as its own ephemeral port connected to itself and held the port (the agent's bind then
    failed, and the start timed out waiting for the kernel); ports reserved before are kept."""
    (tmp_path / "reserved_ports").write_text("8080\n")
    _boot(tmp_path, "exit 1")
    assert (tmp_path / "reserved_ports").read_text() == "8080,50010\n"
    again = tmp_path / "again"
    again.mkdir()
    (again / "reserved_ports").write_text("50010\n")
    _boot(again, "exit 1")
    assert (again / "reserved_ports").read_text() == "50010\n"  # said once


def test_an_image_without_python_ends_the_instance_with_one_line(tmp_path):
    # docker: the image is there; the probe (`docker run`) says what boot.sh says without a Python
    docker = (
        'case "$1" in run) echo \'GPUSESSION_FAILED {"stage":"python","error":"no python3 (3.9 or newer) on '
        "PATH\"}'; exit 3 ;; esac"
    )
    out = _boot(tmp_path, docker)
    (failed,) = find_markers(out, Marker.FAILED)
    assert failed["stage"] == "python"
    assert failed["error"] == (
        "image registry.example/gpusession:1 has no Python to run the session kernel in (no python3 "
        "(3.9 or newer) on PATH): use an image with python3 3.9 or newer"
    )


def test_without_a_runtime_bundle_the_instance_powers_off(tmp_path):
    docker = 'case "$1" in run) echo \'GPUSESSION_PYTHON {"executable":"/usr/bin/python3","version":[3,11,2]}\' ;; esac'
    out = _boot(tmp_path, docker)
    assert find_markers(out, Marker.PYTHON) == [
        {"executable": "/usr/bin/python3", "version": [3, 11, 2]}
    ]
    (failed,) = find_markers(out, Marker.FAILED)
    assert failed == {"stage": "runtime", "error": "no runtime bundle arrived within 2s"}


def test_why_ec2_says_an_instance_ended():
    def inst(state, code=None, message=None):
        return {
            "State": {"Name": state},
            **({"StateReason": {"Code": code, "Message": message}} if code else {}),
        }

    assert ended_reason(inst("running"), interrupted=False) is None
    assert ended_reason(None, interrupted=False) == StopReason(StopKind.GONE)
    assert ended_reason(None, interrupted=True) == StopReason(StopKind.SPOT_INTERRUPTION)
    spot = ended_reason(
        inst(
            "terminated", "Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot"
        ),
        interrupted=False,
    )
    assert spot.kind == StopKind.SPOT_INTERRUPTION
    ended = ended_reason(
        inst(
            "terminated",
            "Client.InstanceInitiatedShutdown",
            "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
        ),
        interrupted=False,
    )
    assert ended == StopReason(
        StopKind.INSTANCE_ENDED,
        detail="terminated: Client.InstanceInitiatedShutdown: Instance initiated shutdown",
    )
    assert ended_reason(inst("stopped"), interrupted=False) == StopReason(
        StopKind.INSTANCE_ENDED, detail="stopped"
    )


def test_the_console_keeps_the_agents_last_words():
    reason = StopReason(StopKind.IDLE, idle_for_s=300.0, idle_timeout_s=300.0)
    output = "\n".join(
        [
            "[  OK  ] Started cloud-init",
            "GPUSESSION_BOOT container started",
            marker_line(Marker.STOPPED, reason.to_dict()),
            marker_line(Marker.SUMMARY, {"cost": 0.1}),
            Marker.POWEROFF.value,
        ]
    )

    class Ec2:
        def get_console_output(self, InstanceId):  # noqa: N803 - boto3's name
            return {"Output": output}

    class Aws:
        ec2 = Ec2()

    assert console_details(Aws(), "i-1") == StopDetails(reason=reason, summary={"cost": 0.1})


def test_the_client_follows_the_boot_from_access_sh_status():
    """What `access.sh status` prints (markers, the pull's latest JSON line per layer) becomes
    progress lines, the image's Python, and a failure in the boot's own words."""
    import json as json_

    from gpusession.backends.cloudvm.link import BootWatch
    from gpusession.core.errors import StageError

    said: list[str] = []
    watch = BootWatch("pytorch/pytorch:x", said.append)
    watch.pull.every_s = 0
    status = "\n".join(
        [
            "GPUSESSION_BOOT starting pytorch/pytorch:x",
            "GPUSESSION_BOOT pulling pytorch/pytorch:x",
            json_.dumps(
                {
                    "status": "Downloading",
                    "id": "a",
                    "progressDetail": {"current": 5e8, "total": 2e9},
                }
            ),
            json_.dumps({"status": "Pull complete", "id": "b"}),
        ]
    )
    watch.read(status)
    watch.read(status)  # polled again: nothing said twice
    assert said == [
        "instance: starting pytorch/pytorch:x",
        "instance: pulling pytorch/pytorch:x",
        "pulling pytorch/pytorch:x: 500 MB of 2.00 GB, 1 of 2 layers done",
        "pulling pytorch/pytorch:x: 500 MB of 2.00 GB, 1 of 2 layers done",
    ]
    python = {
        "executable": "/opt/conda/bin/python3",
        "version": [3, 11, 9],
        "ipykernel": None,
        "pip": "24",
    }
    watch.read(
        status
        + f"\nGPUSESSION_PYTHON {json_.dumps(python)}\nGPUSESSION_BOOT waiting for the runtime"
    )
    assert watch.python.needs_site and watch.waiting_for_runtime and not watch.started
    assert (
        "the image's Python 3.11.9 at /opt/conda/bin/python3, no ipykernel: the runtime brings it"
        in said
    )
    with pytest.raises(
        StageError, match="the instance's start failed: image: cannot pull pytorch/pytorch:x"
    ):
        watch.read('GPUSESSION_FAILED {"stage":"image","error":"cannot pull pytorch/pytorch:x"}')


def test_access_sh_export_passes_the_boots_stream_on_and_fails_when_the_read_failed(tmp_path):
    """`export` asks the boot script (played here by a thread, as root would: size, FIFO, the
    stream, docker's status) and passes the stream on; a read that failed on the instance makes
    it exit non-zero with docker's words, so the client never takes a shorter stream as whole.
    docker's status is read once its file has a line, not as soon as the file is there.
    `import` without a waiting boot and a malformed `import-end` are refused in one line."""
    import os
    import threading

    script = access_script(plan()).replace(
        "DIR=/var/lib/gpusession/0123456789abcdef0123456789abcdef", f"DIR={tmp_path}"
    )
    (tmp_path / "upload").mkdir()

    def access(command):
        return subprocess.run(
            ["sh", "-c", script],
            env={"SSH_ORIGINAL_COMMAND": command, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=30,
        )

    def boot(rc: int) -> None:  # session.sh export_one, for one request
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            requests = list((tmp_path / "upload").glob("export-*"))
            if requests:
                out = tmp_path / requests[0].name
                requests[0].unlink()
                os.mkfifo(f"{out}.pipe")
                Path(f"{out}.size").write_text("10\n")
                with open(f"{out}.pipe", "wb") as pipe:
                    pipe.write(b"0123456789"[: 10 if rc == 0 else 4])
                Path(f"{out}.err").write_text("Error: No such container path\n")
                # as the shell's `>` writes it: the file is there, empty, before its line (a CI
                # run read it then: "docker cp exited ?")
                Path(f"{out}.rc").touch()
                time.sleep(0.5)
                Path(f"{out}.rc").write_text(f"{rc}\n")
                return
            time.sleep(0.05)

    for rc in (0, 1):
        t = threading.Thread(target=boot, args=(rc,))
        t.start()
        done = access("export")
        t.join()
        assert done.stdout == b"10\n" + b"0123456789"[: 10 if rc == 0 else 4]
        if rc == 0:
            assert done.returncode == 0, done.stderr
        else:
            assert done.returncode == 1
            assert b"docker cp exited 1: Error: No such container path" in done.stderr
    refused = access("import")
    assert refused.returncode == 3 and b"waits for no workspace files" in refused.stderr
    assert access("import-end not-a-hash").returncode == 2


def test_botocore_debug_log_never_shows_an_ecr_login_token(caplog):
    """botocore logs each response body at DEBUG (as it logs GetAuthorizationToken's); the token
    is blanked out (test_aws_registry.py checks a real start's DEBUG log)."""
    import logging

    import gpusession.backends.aws.sdk  # noqa: F401 - installs the filter

    caplog.set_level(logging.DEBUG)
    body = b'{"authorizationData":[{"authorizationToken":"QVdTOnNlY3JldA==","expiresAt":1.7E9}]}'
    logging.getLogger("botocore.parsers").debug("Response body:\n%r", body)
    assert "QVdTOnNlY3JldA==" not in caplog.text and '"authorizationToken":"(redacted)"' in (
        caplog.text
    )
