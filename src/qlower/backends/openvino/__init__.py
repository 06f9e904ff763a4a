"""OpenVINO backend (optional extra `openvino`): clusters translated to ONNX by qlower's
translator (the onnxruntime backend's, standard ops only) and compiled by OpenVINO's CPU plugin."""
from .backend import OpenVinoBackend, OvOptions
from .capability import openvino_capability

__all__ = ["OpenVinoBackend", "OvOptions", "openvino_capability"]
