"""The wheel's build backend: maturin's, after one check.

Without `cargo` on the PATH, maturin's backend quietly downloads a Rust toolchain (about 1.1 GB) and builds with it.
A user who typed `pip install .` should instead learn what the build needs, in one message, and choose. Set
OOMDOC_ALLOW_RUST_DOWNLOAD=1 to let maturin fetch the toolchain after all.
"""

import os
import shutil
import subprocess

import maturin
from maturin import *  # noqa: F401,F403  (every PEP 517 hook not wrapped below)

MSRV = (1, 88)


def _check_rust():
    if os.environ.get("OOMDOC_ALLOW_RUST_DOWNLOAD"):
        return
    cargo = shutil.which("cargo")
    if cargo is None:
        raise SystemExit(
            "oomdoc: building oomdoc from source needs Rust (cargo >= %d.%d) on the PATH, and takes about three "
            "minutes. Install it from https://rustup.rs (then open a new shell), or set "
            "OOMDOC_ALLOW_RUST_DOWNLOAD=1 to let the build download a toolchain (about 1.1 GB)." % MSRV
        )
    try:
        out = subprocess.run([cargo, "--version"], capture_output=True, text=True, check=True).stdout
        version = tuple(int(x) for x in out.split()[1].split(".")[:2])
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        return  # an unusual cargo: let the build itself say what is wrong
    if version < MSRV:
        raise SystemExit(
            "oomdoc: building oomdoc needs cargo >= %d.%d; this one is %s. Update it with `rustup update`."
            % (MSRV + (out.strip(),))
        )


def get_requires_for_build_wheel(config_settings=None):
    _check_rust()
    return maturin.get_requires_for_build_wheel(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _check_rust()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    _check_rust()
    return maturin.get_requires_for_build_editable(config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _check_rust()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
