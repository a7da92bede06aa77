"""A command's EOF (its stdin's end) goes out before the CLOSE that answers its end, on a real
sshd: given an EOF for a channel it had freed, sshd drops the whole login ("ieof packet referred
to nonexistent channel"), as an aws boot's status poll met in CI. The window where that happens
(paramiko builds the EOF under the channel's lock and sends it after) is held open here by
sending EOF messages 0.5 s late."""

from __future__ import annotations

import time

import paramiko
import pytest
from paramiko.common import MSG_CHANNEL_EOF

from gpusession.transport.sshlogin import run_on_channel

pytestmark = pytest.mark.integration


def _login(remote: dict) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(remote["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        remote["address"],
        port=remote["port"],
        username=remote["user"],
        key_filename=remote["key_path"],
        look_for_keys=False,
        allow_agent=False,
        timeout=20,
    )
    return client


def _late_eofs(transport: paramiko.Transport, monkeypatch) -> list[float]:
    """Every EOF this side sends waits 0.5 s first (as a thread preempted there would)."""
    sent, send = [], transport._send_user_message

    def late(message) -> None:
        if message.asbytes()[:1] == bytes([MSG_CHANNEL_EOF]):
            time.sleep(0.5)
            sent.append(time.monotonic())
        send(message)

    monkeypatch.setattr(transport, "_send_user_message", late)
    return sent


def test_a_command_that_ends_at_once_keeps_the_login(remote, monkeypatch):
    client = _login(remote)
    try:
        transport = client.get_transport()
        sent = _late_eofs(transport, monkeypatch)
        for _ in range(3):  # `true` ends while its EOF waits; the server's CLOSE comes meanwhile
            status, _, _ = run_on_channel(transport.open_session(timeout=10), "true", timeout=20)
            assert status == 0
        assert len(sent) == 3, "an EOF went out for each"
        time.sleep(0.5)  # sshd's answer to a late EOF would have ended the login by now
        assert transport.is_active(), "the login is kept"
        status, out, _ = run_on_channel(transport.open_session(timeout=10), "echo kept")
        assert (status, out) == (0, b"kept\n")
    finally:
        client.close()
