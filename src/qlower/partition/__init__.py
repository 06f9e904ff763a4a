"""Partitioning by backend capability: clusters run on the backend, the rest in PyTorch."""
from .capability import ALLOW_ENV, DENY_ENV, Capability, holds_empty_tensor
from .cluster import Clustering, cluster_graph

__all__ = ["Capability", "holds_empty_tensor", "Clustering", "cluster_graph", "ALLOW_ENV", "DENY_ENV"]
