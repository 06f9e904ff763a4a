"""IREE backend (optional extra `iree`): integer clusters emitted as TOSA, float clusters through
torch's FX importer, compiled by iree-compile for llvm-cpu and run with iree.runtime."""
from .backend import IreeBackend, iree_capability
from .options import IreeOptions

__all__ = ["IreeBackend", "IreeOptions", "iree_capability"]
