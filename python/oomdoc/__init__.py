"""oomdoc: why your GPU job ran out of memory, and what to change.

The `oomdoc` command does the analysis (`oomdoc analyze oom-0.pickle`); this module captures what it needs::

    import oomdoc
    oomdoc.record()   # at the OOM: oom-<rank>.pickle, and the verdict on stderr

or, without editing the script: ``python -m oomdoc run -- train.py ARGS…`` (``torchrun … -m oomdoc run -- train.py``).

Importing this module does not import torch.
"""
from ._binary import analyze, binary
from ._capture import Recorder, current_rank, record


def _version():
    try:
        from importlib.metadata import version

        return version("oomdoc")
    except Exception:
        return "0+unknown"


__version__ = _version()
__all__ = ["record", "Recorder", "analyze", "binary", "current_rank", "__version__"]
