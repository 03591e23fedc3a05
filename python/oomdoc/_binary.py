"""Finding and running the oomdoc binary that the wheel installs beside the Python scripts."""
import os
import shutil
import subprocess
import sysconfig

_NAME = "oomdoc.exe" if os.name == "nt" else "oomdoc"


def binary():
    """The path of the oomdoc executable, or None.

    Looked up in this order: the OOMDOC_BIN environment variable; the scripts folder of this Python (where
    `pip install oomdoc` puts it, found even when that folder is not on the PATH); the user scripts folder
    (`pip install --user`); the PATH.
    """
    env = os.environ.get("OOMDOC_BIN")
    if env:
        return env
    folders = []
    for scheme in (None, os.name + "_user"):
        try:
            folders.append(sysconfig.get_path("scripts") if scheme is None else sysconfig.get_path("scripts", scheme))
        except (KeyError, ValueError):
            pass
    for folder in folders:
        if folder:
            path = os.path.join(folder, _NAME)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return shutil.which(_NAME)


class BinaryNotFound(RuntimeError):
    pass


def run_binary(args, **kwargs):
    """Runs `oomdoc ARGS…` and returns the CompletedProcess (output captured unless told otherwise)."""
    exe = binary()
    if exe is None:
        raise BinaryNotFound(
            "the oomdoc executable was not found (set OOMDOC_BIN, or reinstall: pip install --force-reinstall oomdoc)"
        )
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([exe, *[str(a) for a in args]], **kwargs)


def analyze(*files, format="text", args=()):
    """The report of `oomdoc analyze FILES…` as a string (format: text, markdown, json or html).

    Raises RuntimeError with oomdoc's own message when the files cannot be read (exit status 2).
    """
    if not files:
        raise ValueError("analyze: give at least one file (a snapshot, a log, an nvidia-smi capture, …)")
    proc = run_binary(["analyze", *files, "--format", format, "--no-progress", "--color", "never", *args])
    if proc.returncode == 2:
        raise RuntimeError(proc.stderr.decode("utf-8", "replace").strip())
    return proc.stdout.decode("utf-8", "replace")
