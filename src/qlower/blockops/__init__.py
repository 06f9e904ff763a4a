"""Block ops: drop-in modules that stay one operator through capture, quantize at their
boundary, and map to one backend kernel (or their decomposition). See docs/blockops.md."""
from . import ops
from .modules import (Attention, BlockGRU, BlockLSTM, GroupNorm, KVCache, LayerNorm, MaskedSoftmax,
                      MultiheadAttention, RMSNorm, RotaryEmbedding, SkipLayerNorm, StatefulGRU, StatefulLSTM,
                      StreamingBuffer)
from .ops import BLOCK_OPS, DECOMPOSITIONS
from .replace import ReplaceReport, replace

__all__ = ["ops", "replace", "ReplaceReport", "BLOCK_OPS", "DECOMPOSITIONS", "RMSNorm", "LayerNorm",
           "SkipLayerNorm", "GroupNorm", "MaskedSoftmax", "Attention", "MultiheadAttention", "RotaryEmbedding",
           "KVCache", "StatefulLSTM", "StatefulGRU", "StreamingBuffer", "BlockLSTM", "BlockGRU"]
