"""Bounds on what reading an untrusted .pt2 file may cost: every check here runs before the
thing it bounds is inflated, parsed, evaluated or allocated (docs/trust.md, "What a loaded file
may contain").

- zip parts: names and declared sizes are read from the central directory (zipfile's infolist;
  nothing inflated) and checked against what each part can be: small fixed records, the file's
  own size for stored parts, a bounded deflate ratio and a total for the rest; torch's reader
  must see the same parts with the same sizes.
- JSON: nesting depth is measured on the bytes (escapes and strings removed, brackets counted)
  before json.loads.
- symbolic expressions: parsed as a Python expression tree (never evaluated) and accepted only
  in the grammar torch's serializer writes (sympy srepr: Symbol/Integer/Add/Mul/Pow/FloorDiv/...)
  with bounded length, depth, literals and exponents.
- tensor payloads: every view lies inside the bytes of its record; an empty record holds only
  empty tensors.
"""
from __future__ import annotations

import ast
import io
import json
import math
import re
import zipfile
from pathlib import Path

from ..errors import ArtifactError

MAX_PARTS = 100_000                 # zip entries
MAX_SMALL_RECORD = 4096             # archive_format, archive_version, byteorder, .data/*
MAX_DEFLATE_RATIO = 100             # a deflated part's size over its compressed size ...
DEFLATE_RATIO_FLOOR = 1 << 20       # ... beyond its first MiB
MAX_INFLATED_FACTOR = 4             # all parts together: at most 4x the file ...
INFLATED_FLOOR = 1 << 24            # ... plus 16 MiB
MAX_JSON_DEPTH = 64                 # nesting of any JSON part (qlower's zoo artifacts: at most 10)
MAX_METADATA_JSON_DEPTH = 200       # JSON inside node metadata (from_node provenance grows with each
                                    # pass and re-save; zoo artifacts: at most 9)
MAX_EXPR_CHARS = 4096               # one symbolic expression
MAX_EXPR_DEPTH = 48                 # its expression tree
MAX_EXPR_INT = 1 << 64              # an integer literal in it
MAX_EXPONENT = 16                   # Pow / ** / PowByNatural / FloatPow / LShift / RShift amount
MAX_SYMBOL_INDEX = 999_999          # s77, u0: torch's deserializer counts unbacked symbols up to it
MAX_DIM = 1 << 48                   # a tensor size or stride in a payload config

_SMALL_RECORDS = frozenset({"archive_format", "archive_version", "byteorder", ".data/version",
                            ".data/serialization_id", "version"})


def _refuse(path, what: str, hint: str = "the file was tampered with or is not a qlower/torch.export file"):
    return ArtifactError(f"{path}: {what}", hint=hint)


# ---------------------------------------------------------------- zip parts

def zip_entries(data: bytes, path: Path, allowed: re.Pattern) -> dict[str, zipfile.ZipInfo]:
    """Part name (without the archive's root folder) -> ZipInfo, read from the central directory
    only. Refuses, before anything is inflated: too many entries, a name outside `allowed`, a
    small record that is not small, a stored part whose sizes disagree, a deflated part beyond
    the ratio, any other compression, and more inflated bytes in all than the file can honestly
    hold."""
    buf = io.BytesIO(data)
    try:
        end = zipfile._EndRecData(buf)   # the end-of-central-directory record, nothing else
        if end is None:
            raise zipfile.BadZipFile("no end of central directory")
        if end[zipfile._ECD_ENTRIES_TOTAL] > MAX_PARTS:
            raise _refuse(path, f"the archive declares {end[zipfile._ECD_ENTRIES_TOTAL]} parts (at most {MAX_PARTS})")
        infos = zipfile.ZipFile(buf).infolist()
    except ArtifactError:
        raise
    except Exception as exc:   # zipfile raises BadZipFile, struct.error, ValueError, UnicodeDecodeError, ...
        raise ArtifactError(f"{path} is not a .pt2 archive: {str(exc)[:200]}",
                            hint="qlower reads files written by qlower.save / torch.export.save") from exc
    entries: dict[str, zipfile.ZipInfo] = {}
    total = 0
    roots = set()
    for info in infos:
        root, _, name = info.filename.partition("/")
        roots.add(root)
        if not root or not name or len(roots) > 1:
            raise _refuse(path, f"part {info.filename[:80]!r} is not inside the archive's one folder")
        if name in entries:
            raise _refuse(path, "the archive lists a part twice")
        if not allowed.fullmatch(name):
            raise ArtifactError(f"{path}: part '{name[:120]}' is not loaded by qlower (only JSON and raw tensor "
                                "parts are; pickles and compiled code never are)",
                                hint="re-export the program with plain tensors (no tensor subclasses, "
                                     "torchbind objects or AOTInductor code)")
        size, packed = info.file_size, info.compress_size
        if info.compress_type == zipfile.ZIP_STORED:
            if size != packed:
                raise _refuse(path, f"part '{name}' is stored but declares {size} bytes in {packed}")
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            if size > max(MAX_DEFLATE_RATIO * packed, DEFLATE_RATIO_FLOOR):
                raise _refuse(path, f"part '{name}' declares {size} bytes inflated from {packed} "
                                    f"(more than {MAX_DEFLATE_RATIO}x): refused before inflating it")
        else:
            raise _refuse(path, f"part '{name}' uses zip compression method {info.compress_type} "
                                "(only stored and deflated parts are read)")
        if name in _SMALL_RECORDS and size > MAX_SMALL_RECORD:
            raise _refuse(path, f"part '{name}' declares {size} bytes (at most {MAX_SMALL_RECORD})")
        total += size
        entries[name] = info
    bound = MAX_INFLATED_FACTOR * len(data) + INFLATED_FLOOR
    if total > bound:
        raise _refuse(path, f"the parts declare {total} bytes in all, more than {bound} for a file of "
                            f"{len(data)} bytes: refused before inflating them")
    return entries


def same_parts(entries: dict[str, zipfile.ZipInfo], reader, path: Path) -> None:
    """torch's zip reader must see the parts zipfile saw, each of the size checked above (two
    readers of one archive must not disagree about what is in it)."""
    names = reader.get_all_records()
    if sorted(names) != sorted(entries):
        extra = sorted(set(names) ^ set(entries))
        raise _refuse(path, f"torch's zip reader and zipfile disagree about part '{(extra or ['?'])[0][:80]}'")
    for name in names:
        if reader.get_record_size(name) != entries[name].file_size:
            raise _refuse(path, f"torch's zip reader and zipfile disagree about the size of part '{name}'")


# ---------------------------------------------------------------- JSON

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(data: bytes) -> int:
    """The deepest bracket nesting of a JSON text, in linear time and without parsing: escape
    pairs go first (so every remaining quote delimits a string), then strings, then everything
    but brackets."""
    import numpy as np
    structure = _STRING.sub(b"", _ESCAPE.sub(b"", data)).translate(None, _NOT_BRACKET)
    if not structure:
        return 0
    steps = np.frombuffer(structure, dtype=np.uint8)
    depth = np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1), dtype=np.int64)
    return int(depth.max())


def load_json(data: bytes | str, part: str, path: Path, max_depth: int = MAX_JSON_DEPTH):
    """json.loads of one part, refused (naming the part) when nested deeper than `max_depth` or
    not JSON."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    depth = json_depth(raw)
    if depth > max_depth:
        raise _refuse(path, f"part '{part}' nests JSON {depth} deep (at most {max_depth})")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: part '{part}' is not JSON: {str(exc)[:200]}",
                            hint="the file is corrupt or was modified") from exc


# ---------------------------------------------------------------- symbolic expressions

# what torch's serializer writes (sympy srepr of shape expressions, _print_sympy) and the
# sympy/torch functions its deserializer defines; nothing else may be called
_SYM_FUNCTIONS = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs",
    "floor", "ceiling", "sqrt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality",
    "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "And", "Or", "Not",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity"})
_SYM_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow"})
_SYM_SHIFTS = frozenset({"LShift", "RShift"})
_SYM_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "True", "False", "int_oo"})
_SYM_KEYWORDS = frozenset({"positive", "negative", "integer", "nonnegative", "nonpositive", "nonzero", "zero",
                           "real", "finite", "infinite", "even", "odd", "rational", "commutative", "precision"})
SYMBOL_NAME = re.compile(r"[a-z]{1,4}(\d{1,6})")
_FLOAT_TEXT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")
_BINARY = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr)
_COMPARE = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def safe_sym_expr(expr: str) -> str | None:
    """None when `expr` is a shape expression of the grammar torch writes, else why not. The
    text is parsed as a Python expression tree, never evaluated: calls only of the functions
    above (no N(), no S(), no attribute access), integer literals below 2**64, powers and shifts
    by at most MAX_EXPONENT with no power inside the base, no factorial (`!`) or `^`, bounded
    length and depth."""
    if not isinstance(expr, str):
        return "not a string"
    if len(expr) > MAX_EXPR_CHARS:
        return f"{len(expr)} characters (at most {MAX_EXPR_CHARS})"
    try:
        tree = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "not an expression"
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPR_DEPTH:
            return f"nested deeper than {MAX_EXPR_DEPTH}"
        why = _sym_node_problem(node)
        if why:
            return why
        func = node.func if isinstance(node, ast.Call) else None   # checked with its call
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node)
                     if child is not func and not isinstance(child, (ast.operator, ast.unaryop, ast.cmpop,
                                                                     ast.expr_context)))
    return None


def _sym_node_problem(node) -> str | None:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            return None if abs(value) < MAX_EXPR_INT else f"the literal {str(value)[:20]}... is too large"
        if isinstance(value, float):
            return None if math.isfinite(value) else "a non-finite literal"
        if isinstance(value, str):
            return None if (SYMBOL_NAME.fullmatch(value) or _FLOAT_TEXT.fullmatch(value)) and len(value) <= 40 \
                else f"the string {value[:20]!r} is not a symbol name or a number"
        return f"a {type(value).__name__} literal"
    if isinstance(node, ast.Name):
        return None if node.id in _SYM_CONSTANTS or SYMBOL_NAME.fullmatch(node.id) else f"the name {node.id[:20]!r}"
    if isinstance(node, ast.UnaryOp):
        return None if isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)) else "a unary operator"
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, _BINARY):
            return f"the operator {type(node.op).__name__}"
        if isinstance(node.op, ast.Pow):
            return _power_problem(node.left, node.right)
        return None
    if isinstance(node, ast.Compare):
        return None if len(node.ops) == 1 and isinstance(node.ops[0], _COMPARE) else "a comparison chain"
    if isinstance(node, ast.keyword):
        if node.arg not in _SYM_KEYWORDS or not isinstance(node.value, ast.Constant) or \
                not isinstance(node.value.value, (bool, int)):
            return f"the keyword {str(node.arg)[:20]!r}"
        if node.arg == "precision" and not 0 < node.value.value <= 113:
            return "a Float precision beyond 113 bits"
        return None
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _SYM_FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
            return f"a call of {name[:20]!r}"
        if node.func.id in _SYM_POWERS:
            return _power_problem(*node.args) if len(node.args) == 2 else "a power without two arguments"
        if node.func.id in _SYM_SHIFTS:
            return None if len(node.args) == 2 and _small_int(node.args[1]) else "a shift by more than a small literal"
        return None
    return f"a {type(node).__name__}"


def _small_int(node) -> bool:
    """An integer literal (possibly negated, possibly Integer(n)) of magnitude <= MAX_EXPONENT."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer" \
            and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value <= MAX_EXPONENT


def _power_problem(base, exponent) -> str | None:
    if not _small_int(exponent):
        return f"a power whose exponent is not an integer literal of at most {MAX_EXPONENT}"
    for sub in ast.walk(base):
        if (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Pow)) or \
                (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in _SYM_POWERS):
            return "a power of a power"
    return None


def check_range_constraints(program: dict, path: Path) -> None:
    """torch's deserializer loops once per unbacked symbol index named in range_constraints:
    names must be symbol names of bounded index, bounds integers or null."""
    constraints = program.get("range_constraints") or {}
    if not isinstance(constraints, dict):
        raise _refuse(path, "range_constraints in part 'models/model.json' is not a mapping")
    for name, bounds in constraints.items():
        if not SYMBOL_NAME.fullmatch(name) or int(SYMBOL_NAME.fullmatch(name).group(1)) > MAX_SYMBOL_INDEX:
            raise _refuse(path, f"range constraint {name[:40]!r} in part 'models/model.json' is not a symbol name")
        values = list(bounds.values()) if isinstance(bounds, dict) else [bounds]
        if not all(v is None or type(v) is int for v in values):
            raise _refuse(path, f"range constraint {name!r} in part 'models/model.json' has non-integer bounds")


# ---------------------------------------------------------------- tensor payloads

def check_payload_config(config: dict, config_name: str, records: dict[str, bytes], path: Path) -> None:
    """Every tensor the config describes lies inside its record: CPU, strided, integer sizes and
    strides, known dtype; offset + sum((size - 1) * stride) within the record's elements (in the
    dtype of the record's first tensor, which torch uses for all of them) and no more elements
    than the record holds (torch saves a view's whole storage, so only an overlapping view, e.g.
    zero strides over a few bytes, has more: 2^20 x 2^20 of them over 128 bytes asked for 4 TiB
    when the program was compiled); a record of no bytes only for tensors of no elements (torch
    would allocate the declared size from nothing)."""
    from torch._export.serde import schema
    dtypes = {st.value: st for st in schema.ScalarType if st != schema.ScalarType.UNKNOWN}
    folder = config_name.rsplit("/", 1)[0]
    record_dtype: dict[str, int] = {}
    for fqn, meta in config.items():
        where = f"'{fqn}' (part '{config_name}')"
        tm = meta.get("tensor_meta") if isinstance(meta, dict) else None
        if not isinstance(tm, dict):
            raise _refuse(path, f"{where} has no tensor description")
        dtype = tm.get("dtype")
        if type(dtype) is not int or dtype not in dtypes:
            raise _refuse(path, f"{where} has dtype {str(dtype)[:20]}, not a tensor dtype")
        if type(tm.get("requires_grad", False)) is not bool or \
                (tm.get("requires_grad") and not _torch_dtype(dtypes[dtype]).is_floating_point
                 and not _torch_dtype(dtypes[dtype]).is_complex):
            raise _refuse(path, f"{where}: requires_grad must be a bool, true only for a floating-point dtype")
        device = tm.get("device")
        if not isinstance(device, dict) or device.get("type") != "cpu" or device.get("index") not in (None, 0):
            raise _refuse(path, f"{where} is not a CPU tensor ({str(device)[:60]})")
        if tm.get("layout") not in (None, schema.Layout.Strided.value):
            raise _refuse(path, f"{where} is not a strided tensor")
        sizes, strides = _ints(tm.get("sizes")), _ints(tm.get("strides"))
        offset = _ints([tm.get("storage_offset")])
        if sizes is None or strides is None or offset is None or len(sizes) != len(strides) or len(sizes) > 64:
            raise _refuse(path, f"{where}: sizes, strides and storage offset must be integers, one stride per size")
        if any(not 0 <= v <= MAX_DIM for v in sizes + strides + offset):
            raise _refuse(path, f"{where}: a size, stride or offset is negative or beyond {MAX_DIM}")
        record = f"{folder}/{meta.get('path_name')}"
        first = record_dtype.setdefault(record, dtype)
        if first != dtype:
            raise _refuse(path, f"{where} reads record '{record}' as another dtype than the tensor before it")
        numel = math.prod(sizes)
        if numel == 0:
            continue
        nbytes = len(records.get(record, b""))
        itemsize = _itemsize(dtypes[dtype])
        last = offset[0] + sum((s - 1) * st for s, st in zip(sizes, strides))
        if nbytes == 0 or nbytes % itemsize or (last + 1) * itemsize > nbytes or numel * itemsize > nbytes:
            raise _refuse(path, f"{where} declares {numel} elements of {itemsize} bytes reaching element {last} "
                                f"of record '{record}', which holds {nbytes} bytes ({nbytes // itemsize} elements)")


def _ints(values) -> list[int] | None:
    if not isinstance(values, list):
        return None
    out = []
    for v in values:
        if not isinstance(v, dict) or set(v) != {"as_int"} or type(v["as_int"]) is not int:
            return None
        out.append(v["as_int"])
    return out


def _torch_dtype(scalar_type):
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE
    return _SERIALIZE_TO_TORCH_DTYPE[scalar_type]


def _itemsize(scalar_type) -> int:
    return _torch_dtype(scalar_type).itemsize
