"""The package list, found rather than listed: each top folder below is mapped into
the flexcomm namespace (`flexcomm.policy` is `policy/`, ...), which setuptools'
own discovery cannot see through, so every package under each mapped folder is
found here. A new subpackage needs nothing; a new top folder, one line in MAPPED."""

from setuptools import find_packages, setup

MAPPED = {
    "flexcomm": "flexcomm",
    "flexcomm.policy": "policy",
    "flexcomm.probe": "probe",
    "flexcomm.emulation": "emulation",
    "flexcomm.agent": "agent",
    "flexcomm.client": "client",
    "flexcomm.proto": "proto",
    "flexcomm.store": "store",
    "flexcomm.lab": "lab",
}


def mapped_packages() -> list[str]:
    """Every package under every mapped folder, by its name in the namespace."""
    return [name for top, folder in MAPPED.items()
            for name in (top, *(f"{top}.{sub}" for sub in find_packages(folder)))]


if __name__ == "__main__":
    setup(packages=mapped_packages(), package_dir=MAPPED)
