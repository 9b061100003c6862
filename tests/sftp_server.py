"""A real OpenSSH sftp server on loopback for the remote step cache tests.

Started as the current user on a free high port with a temporary host key and a temporary
client key (authorized for this server only); stopped, and its folder removed, by the fixture.
Clients find the key through fsspec's standard environment variable FSSPEC_SFTP_KEY_FILENAME.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
INSTALL = "apt-get install -y openssh-server openssh-client"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SftpServer:
    def __init__(self, folder: Path):
        if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
            raise RuntimeError(f"the sftp tests need OpenSSH's server: {INSTALL}")
        self.folder, self.port = folder, _free_port()
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
                check=True,
            )
        (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
        (folder / "authorized_keys").chmod(0o600)
        config = folder / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host_key'}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'sshd.pid'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "StrictModes no\nPermitRootLogin prohibit-password\n"
            "Subsystem sftp internal-sftp\nMaxStartups 100\n"
        )
        if os.geteuid() == 0:  # sshd wants its privilege separation folder
            os.makedirs("/run/sshd", exist_ok=True)
        self.log = open(folder / "sshd.log", "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=self.log, stderr=subprocess.STDOUT
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.folder / 'sshd.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("sshd did not start in 20 s")

    def url(self, path: Path) -> str:
        return f"sftp://127.0.0.1:{self.port}{path}"

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs: the key, through fsspec's own variable."""
        return {**os.environ, "FSSPEC_SFTP_KEY_FILENAME": str(self.folder / "client_key")}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
