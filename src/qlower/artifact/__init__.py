"""Safe .pt2 files: torch.export's archive layout, written atomically with a sha256 manifest,
read without running anything the file carries.

Why not `torch.export.load`: it unpickles entries marked `use_pickle` (tensor subclasses),
torchbind / opaque constants and the sample inputs (`torch.load(weights_only=True)`, then
silently `weights_only=False` on failure); its program deserializer `sympy.sympify`s (evals)
symbolic expressions, resolves node targets by `getattr` on `torch` (`torch.os.system`
resolves), and `ep.module()` execs the program's `guards_code` and puts its argument names
into generated source. Each of those runs code chosen by whoever wrote the file.

Here the file is read once into memory and, before anything is deserialized: every entry must
be one torch.export writes for plain tensors (JSON, raw tensor bytes; no pickles, no compiled
code), checked by name and declared size before it is inflated; no payload may be pickled and
every tensor view must lie inside its record; JSON is depth-limited; symbolic expressions must
be of the grammar torch writes (limits.py); and a qlower artifact's parts must match its
manifest's sha256. After deserialization every node target must be an allow-listed operator
(allowlist.py) writing only into tensors the program owns, weights must match the graph, guards
code is dropped (qlower checks inputs itself) and argument names must be identifiers.
docs/trust.md states what this guarantees ("What a loaded file may contain").
"""
from __future__ import annotations

import copy
import hashlib
import importlib
import io
import json
import keyword
import re
from pathlib import Path

import torch

from .. import ops  # noqa: F401  (qlower ops must be registered before a program is deserialised)
from ..core.files import atomic_write
from ..core.version import __version__
from ..errors import ArtifactError
from . import allowlist, limits

ARTIFACT_FORMAT = 2        # 1: torch.export.save + qlower.json, no manifest (never safe to load)
MANIFEST = "extra/qlower.manifest.json"
_WRITER_RECORDS = {".data/version", ".data/serialization_id"}  # written by the zip writer itself
_ALLOWED = re.compile(
    r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/model\.json|data/sample_inputs/model\.pt"
    r"|data/weights/model_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/model_constants_config\.json|data/constants/tensor_\d+"
    r"|extra/[\w.\-]+")
_PAYLOAD_NAME = {"data/weights/model_weights_config.json": re.compile(r"weight_\d+"),
                 "data/constants/model_constants_config.json": re.compile(r"tensor_\d+")}
_SAFE_FUNCTIONS = allowlist.SAFE_FUNCTIONS


# ---------------------------------------------------------------- writing

def write_pt2(ep: torch.export.ExportedProgram, path: str | Path, extra_files: dict[str, str] | None = None,
              manifest_fields: dict | None = None) -> Path:
    """Write `ep` as a .pt2 archive that torch.export.load also reads, plus a manifest with the
    sha256 of every part. The sample inputs are left out (torch would pickle them). The file is
    written next to `path` and renamed into place, so a crash never leaves half a file."""
    path = Path(path)
    ep = copy.copy(ep)           # the caller's program keeps its example inputs
    ep.example_inputs = None
    first = io.BytesIO()
    torch.export.save(ep, first, extra_files=extra_files or {})
    parts = _records(first.getvalue(), path, check_names=False)
    _check_payloads(parts, path)   # never write what load would refuse (e.g. a tensor subclass)
    manifest = {"format": ARTIFACT_FORMAT, "qlower_version": __version__, "torch_version": torch.__version__,
                **(manifest_fields or {}),
                "parts": {n: _sha256(d) for n, d in parts.items() if n not in _WRITER_RECORDS}}
    atomic_write(path, lambda tmp: _write_archive(tmp, parts, manifest))
    return path


def _write_archive(tmp: Path, parts: dict[str, bytes], manifest: dict) -> None:
    from torch.export.pt2_archive import PT2ArchiveWriter
    with PT2ArchiveWriter(str(tmp)) as writer:
        for name, data in parts.items():
            if name not in _WRITER_RECORDS and not writer.has_record(name):
                writer.write_bytes(name, data)
        writer.write_string(MANIFEST, json.dumps(manifest, sort_keys=True))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- reading

def read_pt2(path: str | Path, *, require_manifest: bool
             ) -> tuple[torch.export.ExportedProgram, dict[str, str], dict | None]:
    """(program, extra files, manifest or None) of a .pt2 file, checked as the module docstring
    says before anything is deserialized. Every refusal is an ArtifactError naming the part."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"no such file: {path}", hint="check the path")
    data = path.read_bytes()
    records = _records(data, path)   # names and declared sizes checked before anything is inflated
    _check_names(records, path)
    _check_payloads(records, path)
    manifest = _manifest(records, path)
    if manifest is None and require_manifest and "extra/qlower.json" in records:
        raise ArtifactError(f"{path} was written by an older qlower, without an integrity manifest",
                            hint="re-save it from the source model with this qlower version")
    if manifest is None and require_manifest:
        raise ArtifactError(f"{path} is not a qlower artifact (no {MANIFEST})",
                            hint="plain torch.export programs load with qlower.load_pt2(); compile them "
                                 "with qlower.compile(program, example_inputs)")
    if manifest is not None:
        _check_parts(manifest, records, path)
    _register_spec_classes(_check_program_json(records["models/model.json"], path), path)
    ep = _deserialize(data, records, path)
    _check_program(ep, path)
    extras = {n[len("extra/"):]: d.decode("utf-8", "replace") for n, d in records.items()
              if n.startswith("extra/") and n != MANIFEST}
    return ep, extras, manifest


def _records(data: bytes, path: Path | None = None, *, check_names: bool = True) -> dict[str, bytes]:
    """Every record of the archive, as torch's own reader returns it (what it would deserialize).
    Before anything is inflated, zipfile reads the central directory: part names (the allowed
    ones unless `check_names` is False), declared sizes and compression ratios are bounded
    (limits.zip_entries), and torch's reader must list the same parts with the same sizes."""
    from torch.export.pt2_archive import PT2ArchiveReader
    entries = limits.zip_entries(data, path, _ALLOWED if check_names else re.compile(r".+"))
    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
        limits.same_parts(entries, reader.archive_file, path)
        names = reader.get_file_names()
    except ArtifactError:
        raise
    except Exception as exc:
        raise ArtifactError(f"{path} is not a .pt2 archive: {_first_line(exc)}",
                            hint="qlower reads files written by qlower.save / torch.export.save") from exc
    if len(names) != len(set(names)):
        raise ArtifactError(f"{path}: the archive lists a part twice", hint="the file was tampered with")
    records = {}
    for name in names:
        try:
            records[name] = reader.read_bytes(name)
        except Exception as exc:
            raise ArtifactError(f"{path}: part '{name}' cannot be read: {_first_line(exc)}",
                                hint="the file is corrupt or truncated") from exc
    return records


def _check_names(records: dict[str, bytes], path: Path) -> None:
    for name in records:
        if not _ALLOWED.fullmatch(name):
            raise ArtifactError(f"{path}: part '{name}' is not loaded by qlower (only JSON and raw tensor "
                                "parts are; pickles and compiled code never are)",
                                hint="re-export the program with plain tensors (no tensor subclasses, "
                                     "torchbind objects or AOTInductor code)")
    for required in ("models/model.json", "archive_version"):
        if required not in records:
            raise ArtifactError(f"{path}: part '{required}' is missing", hint="the file is truncated or not a program")
    from torch.export.pt2_archive.constants import ARCHIVE_VERSION_VALUE
    if records["archive_version"].decode(errors="replace") != ARCHIVE_VERSION_VALUE:
        raise ArtifactError(f"{path}: archive version {records['archive_version'][:20]!r} is not "
                            f"{ARCHIVE_VERSION_VALUE!r}",
                            hint="written by another torch version; re-save it with this one")


def _manifest(records: dict[str, bytes], path: Path) -> dict | None:
    if MANIFEST not in records:
        return None
    manifest = limits.load_json(records[MANIFEST], MANIFEST, path)
    try:
        fmt, parts = manifest["format"], manifest["parts"]
        if not isinstance(fmt, int) or not isinstance(parts, dict):
            raise TypeError("format must be an int and parts a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{path}: part '{MANIFEST}' is malformed: {exc}",
                            hint="the file was tampered with") from exc
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in parts.items()):
        raise ArtifactError(f"{path}: part '{MANIFEST}' is malformed: parts must map names to sha256 strings",
                            hint="the file was tampered with")
    if fmt > ARTIFACT_FORMAT:
        raise ArtifactError(f"{path} has artifact format {fmt} (qlower {manifest.get('qlower_version')}); "
                            f"this qlower reads format {ARTIFACT_FORMAT}",
                            hint="upgrade qlower (pip install -U qlower) or re-save the model with this version")
    if fmt < ARTIFACT_FORMAT:
        raise ArtifactError(f"{path} has artifact format {fmt}, which had no integrity manifest",
                            hint="re-save the model with this qlower version")
    return manifest


def _check_parts(manifest: dict, records: dict[str, bytes], path: Path) -> None:
    """Every part (but the manifest and the zip writer's own records) is listed with its sha256."""
    listed = manifest["parts"]
    for name, data in records.items():
        if name == MANIFEST or name in _WRITER_RECORDS:
            continue
        if name not in listed:
            raise ArtifactError(f"{path}: part '{name}' is not in the manifest", hint="the file was tampered with")
        if _sha256(data) != listed[name]:
            raise ArtifactError(f"{path}: part '{name}' does not match its sha256 in the manifest",
                                hint="the file is corrupt or was modified; re-save it from the source model")
    missing = sorted(set(listed) - set(records))
    if missing:
        raise ArtifactError(f"{path}: part '{missing[0]}' listed in the manifest is missing",
                            hint="the file is truncated or was modified")


def _check_payloads(records: dict[str, bytes], path: Path) -> None:
    """Weights and constants must be raw tensor bytes: nothing marked use_pickle, no torchbind
    (custom_obj_) or opaque (opaque_obj_) objects, each payload's part present."""
    for config_name, allowed in _PAYLOAD_NAME.items():
        if config_name not in records:
            continue
        document = limits.load_json(records[config_name], config_name, path)
        try:
            config = document["config"]
            items = list(config.items())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ArtifactError(f"{path}: part '{config_name}' is malformed: {exc}",
                                hint="the file was tampered with") from exc
        for fqn, meta in items:
            if not isinstance(meta, dict) or meta.get("use_pickle") or meta.get("tensor_meta") is None:
                raise ArtifactError(f"{path}: '{fqn}' is stored as a pickle (part '{config_name}'); "
                                    "qlower never unpickles", hint="save plain tensors (no tensor subclasses)")
            name = str(meta.get("path_name"))
            if not allowed.fullmatch(name) or f"{config_name.rsplit('/', 1)[0]}/{name}" not in records:
                raise ArtifactError(f"{path}: '{fqn}' refers to part '{name}', which is not a raw tensor part",
                                    hint="the file was tampered with or holds non-tensor objects")
        limits.check_payload_config(config, config_name, records, path)


def _check_program_json(data: bytes, path: Path) -> dict:
    """torch's deserializer sympify()s (evaluates) every `expr_str` and json.loads the `custom`
    and `from_node` metadata of every node: expressions must be of the grammar torch writes
    (limits.safe_sym_expr), nested JSON shallow, range constraints named by symbols."""
    program = limits.load_json(data, "models/model.json", path)
    if not isinstance(program, dict):
        raise ArtifactError(f"{path}: part 'models/model.json' is not a program", hint="the file is corrupt")
    for expr in _expr_strings(program):
        why = limits.safe_sym_expr(expr)
        if why:
            raise ArtifactError(f"{path}: symbolic expression {str(expr)[:80]!r} (field 'expr_str' in part "
                                f"'models/model.json') is not arithmetic of the form torch writes: {why}",
                                hint="the file was tampered with")
    for text in _nested_json(program):
        limits.load_json(text, "models/model.json (node metadata)", path, limits.MAX_METADATA_JSON_DEPTH)
    limits.check_range_constraints(program, path)
    return program


def _register_spec_classes(program: dict, path: Path) -> None:
    """Every class the program's input and output specs name must be registered with pytree
    before torch deserializes them. An unregistered one defined in a module of the fixed
    allow-list (allowlist.PYTREE_MODULES, e.g. transformers.modeling_outputs) is registered by
    importing that module (qlower's string, never the file's); any other is refused, saying what
    to import."""
    from torch.utils import _pytree

    for name in sorted(_spec_types(program, path)):
        if name in _pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
            continue
        module = allowlist.pytree_module(name)
        if module is not None:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ArtifactError(f"{path}: the program's outputs are of class {name!r}, and importing "
                                    f"{module} failed: {_first_line(exc)}",
                                    hint=f"install the package that provides {module}") from exc
            if name in _pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
                continue
        shown = name[:200]
        raise ArtifactError(f"{path}: the program's inputs or outputs are of class {shown!r}, which is not "
                            "registered with torch.utils._pytree",
                            hint=f"import the module that defines and registers it (import "
                                 f"{shown.rpartition('.')[0] or shown}) before loading; qlower imports only "
                                 f"{', '.join(allowlist.PYTREE_MODULES)} itself")


def _spec_types(program: dict, path: Path) -> set[str]:
    """The class names (`type`) of the pytree specs (`in_spec`, `out_spec`) of the program."""
    names: set[str] = set()
    stack = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("in_spec", "out_spec") and isinstance(value, str):
                    specs = [limits.load_json(value, "models/model.json (pytree spec)", path,
                                              limits.MAX_METADATA_JSON_DEPTH)]
                    while specs:
                        spec = specs.pop()
                        if isinstance(spec, dict):
                            if isinstance(spec.get("type"), str):
                                names.add(spec["type"])
                            specs.extend(spec.values())
                        elif isinstance(spec, list):
                            specs.extend(spec)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return names


def _nested_json(obj):
    """The JSON texts torch's deserializer parses out of node metadata."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("custom", "from_node") and isinstance(value, str):
                    yield value
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _expr_strings(obj):
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "expr_str":
                    yield value if isinstance(value, str) else repr(value)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _safe_sym_expr(expr: str) -> bool:
    return limits.safe_sym_expr(expr) is None


def _deserialize(data: bytes, records: dict[str, bytes], path: Path) -> torch.export.ExportedProgram:
    """The program from its JSON and raw tensor parts, read from the same bytes that were checked
    (all pickle paths were refused above; the sample inputs are never read)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass
    from torch.export.pt2_archive._package import PT2ArchiveReader, _load_constants, _load_state_dict

    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
        serialized = _bytes_to_dataclass(schema.ExportedProgram, records["models/model.json"])
        has = set(records)
        state = _load_state_dict(reader, "model") if "data/weights/model_weights_config.json" in has else {}
        consts = _load_constants(reader, "model") if "data/constants/model_constants_config.json" in has else {}
        return ExportedProgramDeserializer().deserialize(serialized, state, consts, None)
    except Exception as exc:
        raise ArtifactError(f"{path}: the program cannot be rebuilt: {_first_line(exc)}",
                            hint="written by another torch/qlower version, or corrupt; re-save it with "
                                 "this version") from exc


def _check_program(ep: torch.export.ExportedProgram, path: Path) -> None:
    """Nothing the program runs or generates source from is left to the file: node targets are
    allow-listed operators (artifact/allowlist.py) writing only into tensors the program owns,
    attribute and argument names cannot be code, weights are what the graph says they are,
    guards code is dropped (qlower checks inputs itself; ep.module() would exec it)."""
    _check_targets(ep, path)
    _check_attribute_names(ep, path)
    _check_argument_names(ep, path)
    _check_weights(ep, path)
    ep._guards_code = []


def _check_targets(ep: torch.export.ExportedProgram, path: Path) -> None:
    """Every call and every callable argument (HOPs call theirs) is an allow-listed operator;
    a node writes only into tensors the program owns (buffers, constants, computed tensors); string arguments cannot
    break out of a quoted string in the text formats backends write."""
    sig = ep.graph_signature
    writable = set(sig.inputs_to_buffers) | set(getattr(sig, "inputs_to_lifted_tensor_constants", {}))
    where = "in part 'models/model.json'"
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        top = gm is ep.graph_module
        for node in gm.graph.nodes:
            if node.op in ("call_method", "call_module"):
                raise ArtifactError(f"{path}: node '{node.name}' is a {node.op} (field 'target' {where}); loaded "
                                    "programs call operators only", node=node.name, hint="the file was tampered with")
            if node.op == "call_function":
                why = allowlist.operator_problem(node.target) or \
                    allowlist.mutation_problem(node, writable if top else set())
                if why:
                    raise ArtifactError(f"{path}: node '{node.name}' calls {_target_name(node.target)!r} (field "
                                        f"'target' {where}), which a loaded program may not call: {why}",
                                        node=node.name, hint="the file was tampered with, or the program calls an "
                                                             "operator outside docs/trust.md's allow-list")
            for value in _leaves((node.args, node.kwargs)):
                why = None
                if isinstance(value, str):
                    why = allowlist.string_problem(value)
                elif callable(value) and not isinstance(value, (torch.fx.Node, torch.fx.GraphModule)):
                    why = allowlist.operator_problem(value)
                    why = why and f"it passes {_target_name(value)!r}: {why}"
                if why:
                    raise ArtifactError(f"{path}: node '{node.name}' (field 'inputs' {where}): {why}",
                                        node=node.name, hint="the file was tampered with")


def _target_name(target) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return f"{schema.name}{'.' + schema.overload_name if schema.overload_name else ''}"
    return str(getattr(target, "__name__", target))[:80]


def _check_weights(ep: torch.export.ExportedProgram, path: Path) -> None:
    """Each parameter, buffer and constant tensor has the shape and dtype its placeholder in the
    graph declares (else the program fails at its first call, not at load)."""
    from torch.export.graph_signature import InputKind
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        tensor = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
        part = "data/weights/model_weights_config.json" if spec.target in ep.state_dict \
            else "data/constants/model_constants_config.json"
        node = placeholders.get(getattr(spec.arg, "name", None))
        val = node.meta.get("val") if node is not None else None
        if not isinstance(tensor, torch.Tensor) or not isinstance(val, torch.Tensor):
            raise ArtifactError(f"{path}: weight '{spec.target}' is missing from part '{part}' or from the graph",
                                hint="the file was tampered with")
        declared = tuple(int(d) if isinstance(d, int) else None for d in val.shape)
        if val.dtype != tensor.dtype or declared != tuple(tensor.shape):
            raise ArtifactError(f"{path}: weight '{spec.target}' (part '{part}') is {str(tensor.dtype)[6:]}"
                                f"{list(tensor.shape)} but the graph declares {str(val.dtype)[6:]}{list(declared)}",
                                hint="the file was tampered with")


def _check_argument_names(ep: torch.export.ExportedProgram, path: Path) -> None:
    """ep.module() writes forward()'s argument names (and keyword names) into source."""
    for entry in ep.module_call_graph:
        sig = entry.signature
        if sig is None:
            continue
        names = list(getattr(sig, "forward_arg_names", None) or [])
        if sig.in_spec is not None and sig.in_spec.num_children == 2 and sig.in_spec.child(1).type is dict:
            names += list(sig.in_spec.child(1).context)
        bad = [n for n in names if not isinstance(n, str) or not n.isidentifier() or keyword.iskeyword(n)]
        if bad:
            raise ArtifactError(f"{path}: argument name {str(bad[0])[:80]!r} is not an identifier",
                                hint="the file was tampered with")


_SAFE_FQN = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")


def _check_attribute_names(ep: torch.export.ExportedProgram, path: Path) -> None:
    """FX writes get_attr targets (parameter / buffer / constant / subgraph names) into the
    forward() source it generates, quoting a non-identifier as getattr(self, "<name>"); a name
    holding a quote would be code. Names must be dotted runs of [A-Za-z0-9_]."""
    sig = ep.graph_signature
    names = [getattr(spec, "target", None) for spec in list(sig.input_specs) + list(sig.output_specs)]
    names += list(ep.state_dict) + list(ep.constants)
    names += [n.target for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)
              for n in gm.graph.nodes if n.op in ("get_attr", "call_module")]
    bad = next((n for n in names if n is not None and not (isinstance(n, str) and _SAFE_FQN.fullmatch(n))), None)
    if bad is not None:
        raise ArtifactError(f"{path}: attribute name {str(bad)[:80]!r} is not a dotted name",
                            hint="the file was tampered with")


def _leaves(obj):
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)
    else:
        yield obj


def _safe_callable(target) -> bool:
    return allowlist.operator_problem(target) is None
