"""The compose images built and smoke-tested with podman and runc (Debian packages), as root
or rootless, without systemd or a Docker engine.

Flags that make podman work on a host like this one: its own storage under the test's tmp
dir (--root/--runroot/--tmpdir, the vfs driver: no overlay mount needed),
--cgroup-manager=cgroupfs and --events-backend=none (no systemd journal; `file` would write
under /run), --runtime=runc, and explicit low ulimits (the host
may lack CAP_SYS_RESOURCE, so runc cannot set the container's nofile/nproc to podman's
defaults: "error setting rlimits ... operation not permitted"). `podman build` and `pull` keep a
blob-info cache outside --root (/var/lib/containers/cache as root, ~/.local/share as a
user), so as root every podman call runs in a private mount namespace with a tmp dir bound
over /var/lib/containers, and as a user with HOME in the tmp dir: nothing is written outside.

Building a compose image needs its base image from a registry (TRAINWATCH_IMAGE_REGISTRY).
Where none is configured or reachable (as on the development machine) those tests skip and
say so; the podman machinery itself is still checked here by building and running an image
made from a local binary (node_exporter from the Debian package, with its shared libraries).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.support.net import free_port, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
FROM_LINE = re.compile(r"^FROM\s+(\S+)", re.MULTILINE | re.IGNORECASE)
# Images compose pulls, and the argv that prints their version (their own entrypoint).
VERSION_SMOKE = {"prometheus": ["--version"], "alertmanager": ["--version"]}


SYSTEM_CACHE = Path("/var/lib/containers")
# Binds the tmp dir ($0) over the system cache for this podman process only.
IN_PRIVATE_MOUNTS = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                     'mount --bind "$0" /var/lib/containers && exec "$@"']


@dataclass
class Podman:
    argv: list[str]
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([*self.argv, *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, check=False)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return self("run", *ULIMITS, *args, timeout=120)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    missing = [name for name in ("podman", "runc") if shutil.which(name) is None
               and not Path("/usr/sbin", name).exists()]
    if missing:
        pytest.skip(f"{missing} not installed (Debian packages podman, runc; scripts/setup.sh)")
    store = tmp_path_factory.mktemp("podman")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(store / "home")}
    wrapper: list[str] = []
    if os.geteuid() == 0:
        if not SYSTEM_CACHE.is_dir():
            pytest.skip(f"{SYSTEM_CACHE} is missing, so it cannot be shadowed for the test: "
                        "run scripts/setup.sh --tests")
        (store / "system-cache").mkdir()
        wrapper = [*IN_PRIVATE_MOUNTS, str(store / "system-cache")]
    tool = Podman([*wrapper, "podman", "--root", str(store / "root"),
                   "--runroot", str(store / "run"), "--tmpdir", str(store / "tmp"),
                   "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
                   "--events-backend", "none", "--runtime", "runc"], env)
    info = tool("info", timeout=60)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run on this host: {info.stderr.strip()[-500:]}")
    try:
        yield tool
    finally:
        tool("rm", "--all", "--force", timeout=120)
        tool("rmi", "--all", "--force", timeout=120)
        shutil.rmtree(store, ignore_errors=True)


def qualified(image: str) -> str | None:
    """`image` as Docker resolves a short name, on the registry named by
    TRAINWATCH_IMAGE_REGISTRY (Docker's default registry host, or a mirror); None without it.

    The registry comes from the environment so that no registry host is written here."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return image
    registry = os.environ.get("TRAINWATCH_IMAGE_REGISTRY", "").strip().rstrip("/")
    if not registry:
        return None
    return f"{registry}/library/{image}" if not rest else f"{registry}/{image}"


def pull_or_skip(podman: Podman, image: str) -> str:
    """Pull `image` (fully qualified), or skip the test saying why it cannot be had."""
    name = qualified(image)
    if name is None:
        pytest.skip(f"{image}: no image registry configured (set TRAINWATCH_IMAGE_REGISTRY to "
                    "the registry or mirror that serves the compose base images)")
    if podman("image", "exists", name).returncode == 0:
        return name
    pulled = podman("pull", "--quiet", name, timeout=300)
    if pulled.returncode != 0:
        pytest.skip(f"no image registry reachable from this host, cannot pull {image} "
                    f"(podman pull exited {pulled.returncode})")
    return name


def local_image_context(directory: Path, binary: Path) -> Path:
    """A build context holding `binary` and the shared libraries it loads (ldd)."""
    (directory / "bin").mkdir(parents=True)
    shutil.copy2(binary, directory / "bin" / binary.name)
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    for library in re.findall(r"(/\S+)", ldd):
        target = directory / library.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(library), target)
    tops = sorted({p.name for p in directory.iterdir()})
    (directory / "Containerfile").write_text(
        "FROM scratch\n" + "".join(f"COPY {top} /{top}\n" for top in tops)
        + f'ENTRYPOINT ["/bin/{binary.name}"]\n')
    return directory


def test_podman_builds_and_runs_an_image_on_this_host(podman: Podman, tmp_path: Path) -> None:
    binary = Path(shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter")
    context = local_image_context(tmp_path / "context", binary)
    built = podman("build", "--quiet", "--tag", "localhost/trainwatch-fieldcheck:test",
                   str(context))
    assert built.returncode == 0, built.stderr
    version = podman.run("--rm", "--network", "none", "localhost/trainwatch-fieldcheck:test",
                         "--version")
    assert version.returncode == 0, version.stderr
    assert "node_exporter" in version.stdout + version.stderr
    port = free_port()
    started = podman.run("--detach", "--name", "fieldcheck-node", "--network", "host",
                         "localhost/trainwatch-fieldcheck:test",
                         f"--web.listen-address=127.0.0.1:{port}",
                         "--collector.disable-defaults", "--collector.loadavg")
    assert started.returncode == 0, started.stderr
    try:
        body = wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text,
                          timeout=60, what="node_exporter in the container")
        assert "node_load1" in body
    finally:
        podman("rm", "--force", "--time", "5", "fieldcheck-node", timeout=120)


@pytest.fixture(scope="module")
def compose_services(compose_rendered: Path) -> dict:
    """The services of the rendered compose file (compose/render.yml)."""
    return yaml.safe_load((compose_rendered / "docker-compose.yml").read_text())["services"]


def test_compose_images_build_and_answer(podman: Podman, compose_services: dict,
                                         compose_rendered: Path) -> None:
    built_here = {name: s for name, s in compose_services.items() if "build" in s}
    assert built_here.keys() == {"remediation"}  # the smoke test below is the remediation one
    for service in built_here.values():
        context = (compose_rendered / service["build"]["context"]).resolve()
        dockerfile = context / service["build"]["dockerfile"]
        for base in FROM_LINE.findall(dockerfile.read_text()):
            pull_or_skip(podman, base)
        built = podman("build", "--quiet", "--tag", service["image"], "--file", str(dockerfile),
                       str(context), timeout=600)
        assert built.returncode == 0, built.stderr
        smoke = podman.run("--rm", "--network", "none", "--entrypoint", "remediation-server",
                           service["image"], "--help")
        assert smoke.returncode == 0, smoke.stderr
        assert "--config" in smoke.stdout


@pytest.mark.parametrize("name", sorted(VERSION_SMOKE))
def test_compose_pulled_image_starts(podman: Podman, compose_services: dict, name: str) -> None:
    image = pull_or_skip(podman, compose_services[name]["image"])
    proc = podman.run("--rm", "--network", "none", image, *VERSION_SMOKE[name])
    assert proc.returncode == 0, proc.stderr
    assert "version" in proc.stdout + proc.stderr
