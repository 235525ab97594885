"""Package downloads into the data cache and reading files out of them, without installing anything.

Debian packages come through `apt-get download` (the candidate version of the configured archive), npm packages
through `npm pack NAME@VERSION`. A package already in the downloads folder is reused (no network) unless
`refresh` is set. Archive members are streamed: `dpkg-deb --fsys-tarfile` for .deb, tarfile for npm's .tgz.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Callable, Iterator


class FetchError(RuntimeError):
    pass


def _require_command(name: str, hint: str) -> str:
    path = shutil.which(name)
    if not path:
        raise FetchError(f"`{name}` not found on PATH; {hint}")
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def apt_download(package: str, downloads: Path, refresh: bool = False, log=print) -> Path:
    """The .deb of `package` in `downloads` (fetched with `apt-get download` if absent or `refresh`).
    Runs `apt-get update` once and retries when the package lists do not know the package (as root only)."""
    downloads.mkdir(parents=True, exist_ok=True)
    existing = sorted(glob.glob(str(downloads / f"{glob.escape(package)}_*.deb")))
    if existing and not refresh:
        return Path(existing[-1])
    _require_command("apt-get", "Debian's apt is needed to download the corpus packages")
    for old in existing:
        os.remove(old)
    log(f"data: apt-get download {package}")
    cmd = ["apt-get", "download", "-q", package]
    result = subprocess.run(cmd, cwd=downloads, capture_output=True, text=True)
    if result.returncode != 0 and os.geteuid() == 0:
        log("data: apt-get download failed; running apt-get update once and retrying")
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
        result = subprocess.run(cmd, cwd=downloads, capture_output=True, text=True)
    if result.returncode != 0:
        raise FetchError(f"`apt-get download {package}` failed (exit {result.returncode}): "
                         f"{result.stderr.strip()[-800:]}\nRun `apt-get update` first if the package lists are "
                         f"missing; the package must exist in the configured Debian archive.")
    found = sorted(glob.glob(str(downloads / f"{glob.escape(package)}_*.deb")))
    if not found:
        raise FetchError(f"`apt-get download {package}` succeeded but left no {package}_*.deb in {downloads}")
    return Path(found[-1])


def npm_pack(name: str, version: str, downloads: Path, refresh: bool = False, log=print) -> Path:
    """The tarball of npm package `name@version` in `downloads` (fetched with `npm pack` if absent or `refresh`).
    npm's own cache goes to downloads/npm-cache, not to the home folder."""
    downloads.mkdir(parents=True, exist_ok=True)
    tarball = downloads / (name.lstrip("@").replace("/", "-") + f"-{version}.tgz")
    if tarball.exists() and not refresh:
        return tarball
    _require_command("npm", "Node.js's npm is needed to download the npm corpus packages (scripts/setup.sh)")
    log(f"data: npm pack {name}@{version}")
    result = subprocess.run(["npm", "pack", f"{name}@{version}", "--pack-destination", str(downloads),
                             "--cache", str(downloads / "npm-cache"), "--silent"],
                            capture_output=True, text=True)
    if result.returncode != 0 or not tarball.exists():
        raise FetchError(f"`npm pack {name}@{version}` failed (exit {result.returncode}) or left no {tarball.name}: "
                         f"{result.stderr.strip()[-800:]}")
    return tarball


def deb_field(deb: Path, field: str) -> str:
    """A control field of a .deb (e.g. Version), via dpkg-deb."""
    _require_command("dpkg-deb", "dpkg is needed to read Debian packages")
    result = subprocess.run(["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True)
    if result.returncode != 0:
        raise FetchError(f"{deb}: not a readable Debian package: {result.stderr.strip()}")
    return result.stdout.strip()


def iter_deb_members(deb: Path, want: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(path, content) of each regular file of a .deb's data archive for which want(path) holds, in archive order;
    paths without the leading "./"."""
    _require_command("dpkg-deb", "dpkg is needed to read Debian packages")
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name
                if member.isfile() and want(name):
                    yield name, tar.extractfile(member).read()
    finally:
        proc.stdout.close()
        if proc.wait() != 0:
            raise FetchError(f"dpkg-deb --fsys-tarfile {deb} failed (exit {proc.returncode})")


def iter_tgz_members(tgz: Path, want: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(path, content) of each regular file of a gzip'd tarball (npm pack) for which want(path) holds."""
    with tarfile.open(tgz, mode="r:gz") as tar:
        for member in tar:
            if member.isfile() and want(member.name):
                yield member.name, tar.extractfile(member).read()
