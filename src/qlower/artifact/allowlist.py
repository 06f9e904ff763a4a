"""Which operators a loaded program may call (artifact/__init__.py checks every node of every
graph of the program; docs/trust.md, "What a loaded file may contain").

torch.export leaves in a program any ATen operator the model called (its training IR keeps
composite operators such as aten.linear, and non-core ones such as aten.histc), and qlower's
passes add qlower's own operators. So the ATen part of the allow-list is every registered
`aten` operator that passes this rule, computed once from torch's registry:

- a node of an operator whose schema writes an argument (in-place, out=) writes only into a
  tensor the program owns: one of the buffers or lifted constants its signature declares, or a
  tensor it computed, directly or through views (checked per node: `mutation_problem`; qlower's
  saved programs update module state with aten.copy_ into the buffer, and torch.export's
  training IR keeps in-place ops on intermediates), never into a user input (the caller's
  tensor) or a parameter;
- it takes no file name (an argument named filename/path/file) and is not in the refused
  families: files and printing (from_file, _print); layouts whose kernels trust their index
  data (sparse, nested, jagged, mkldnn, packed fbgemm weights); views that set sizes and strides
  without checking them against the storage (_reshape_alias); autograd and tensor state
  (_backward, requires_grad_, retain_grad, set_data, _version); device and memory state
  (pin_memory, record_stream, set_, resize, _cufft plan caches); a write its schema does not
  declare (_copy_from); torch's own test operators.

Other namespaces: `qlower` (qlower's quantized and block ops) and `quantized_decomposed`
(the Q/DQ ops of torch's PT2E flow), functional ones only. Higher-order operators: the control
flow and grad/autocast-mode wrappers of export (`_HOPS`). Python callables: operator's
arithmetic and comparisons, math's rounding, torch's sym_* functions and asserts."""
from __future__ import annotations

import functools
import math
import operator
import re

import torch

_NAMESPACES = ("aten", "qlower", "quantized_decomposed")
_REFUSED = re.compile(
    r"from_file|_print|.*(?:sparse|nested|jagged|mkldnn|fbgemm|prepack|_cslt_|_cufft_).*"
    r"|_reshape_alias|_backward|requires_grad_|retain_grad|retains_grad|set_data|_version"
    r"|_pin_memory|pin_memory|is_pinned|record_stream|set_?|resize.*|_resize_output_?|_copy_from.*"
    r"|_to_dense|_coalesce|_nnz|_indices|_values|indices|values|crow_indices|col_indices|ccol_indices|row_indices"
    r"|_make_dep_token|_propagate_xla_data|_test_.*|_fused_adagrad_?|_amp_.*")
_FILE_ARGUMENTS = frozenset({"filename", "path", "file", "filepath", "dirname"})
_HOPS = frozenset({"cond", "while_loop", "map_impl", "scan", "associative_scan",
                   "wrap_with_set_grad_enabled", "wrap_with_autocast"})
SAFE_FUNCTIONS = frozenset(
    [getattr(operator, n) for n in ("getitem", "add", "sub", "mul", "truediv", "floordiv", "mod",
                                    "pow", "neg", "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge",
                                    "and_", "or_", "xor", "not_", "invert", "lshift", "rshift")]
    + [getattr(math, n) for n in ("floor", "ceil", "trunc", "sqrt")]
    + [getattr(torch, n) for n in ("sym_int", "sym_float", "sym_max", "sym_min", "sym_not",
                                   "sym_ite", "sym_sqrt", "sym_sum") if hasattr(torch, n)]
    + [torch._assert] + [getattr(torch, n) for n in ("_assert_async", "_assert_scalar") if hasattr(torch, n)])


@functools.cache
def _overload_problem(op: torch._ops.OpOverload) -> str | None:
    """Why this overload is never allowed (None: allowed, writes checked per node)."""
    namespace = op.namespace
    if namespace not in _NAMESPACES:
        return f"namespace '{namespace}' is not loaded (only {', '.join(_NAMESPACES)})"
    name = op._schema.name.split("::", 1)[1]
    if namespace == "aten" and _REFUSED.fullmatch(name):
        return ("it is in a refused family (files, printing, unchecked layouts or views, autograd, device or "
                "memory state)")
    if any(arg.name in _FILE_ARGUMENTS for arg in op._schema.arguments):
        return "it takes a file name"
    if namespace != "aten" and op._schema.is_mutable:
        return "it writes to an argument"
    return None


def operator_problem(target) -> str | None:
    """None when `target` may be called by a loaded program (a per-node write check follows),
    else why not."""
    if isinstance(target, torch._ops.OpOverload):
        return _overload_problem(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return None if target.name() in _HOPS else f"higher-order operator '{target.name()}' is not loaded"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return "an operator packet (a program names one overload)"
    try:
        return None if target in SAFE_FUNCTIONS else "it is not an operator"
    except TypeError:   # unhashable
        return "it is not an operator"


def written_arguments(op: torch._ops.OpOverload, node) -> list:
    """The values `node` passes to arguments `op`'s schema writes."""
    written = []
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if not arg.kwarg_only and i < len(node.args):
            written.append(node.args[i])
        elif arg.name in node.kwargs:
            written.append(node.kwargs[arg.name])
    return written


def mutation_problem(node, writable: set[str]) -> str | None:
    """A node writes only into tensors the program owns: its buffers and lifted constants
    (`writable`: their placeholder names; empty inside subgraphs) or a tensor it computed,
    directly or through views; never into a user input (the caller's tensor) or a parameter."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable:
        return None
    for value in written_arguments(op, node):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            root = _view_root(v)
            if isinstance(root, torch.fx.Node) and (root.op == "call_function" or
                                                    (root.op == "placeholder" and root.name in writable)):
                continue
            what = root.name if isinstance(root, torch.fx.Node) else repr(root)[:40]
            return (f"it writes into '{what}', which is not a buffer, constant or computed tensor of the program "
                    "(a user input or a parameter)")
    return None


# operators whose result shares its first argument's storage without saying so in their schema
_UNDECLARED_VIEWS = frozenset({"aten::_unsafe_view"})


def _view_root(value, limit: int = 10_000):
    """The tensor `value` is a view of: back through every operator whose result may alias an
    argument (schema alias annotations, list results picked by operator.getitem, and
    _UNDECLARED_VIEWS), to a placeholder or to an operator that made a new tensor."""
    while limit and isinstance(value, torch.fx.Node) and value.op == "call_function" and value.args:
        limit -= 1
        target = value.target
        if target is operator.getitem:
            base = value.args[0]
            if not (isinstance(base, torch.fx.Node) and base.op == "call_function"
                    and _aliased(base.target) is not None):
                break
            value = base
            continue
        source = _aliased(target)
        if source is None:
            break
        value = value.args[source] if source < len(value.args) else value.args[0]
    return value


def _aliased(target) -> int | None:
    """The position of the argument `target`'s (first) result may alias, or None. (A list
    result's annotation sits on its element type, which torch's Python schema does not show: an
    annotated result that matches no argument's set is taken to alias the first.)"""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    schema = target._schema
    if schema.name in _UNDECLARED_VIEWS:
        return 0
    result = schema.returns[0].alias_info if schema.returns else None
    if result is None:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.before_set & result.before_set:
            return i
    return 0


_STRING_OK = re.compile(r"[ -~]{0,1024}")   # printable ASCII


def string_problem(value: str) -> str | None:
    """Strings in operator arguments (einsum equations, modes, assert messages) are printable
    ASCII without quotes, backslashes or braces: they may end up inside ONNX/MLIR text."""
    if not _STRING_OK.fullmatch(value) or any(c in value for c in '"\\{}'):
        return f"the string argument {value[:40]!r} holds a quote, backslash, brace or non-printable character"
    return None


# Modules whose import registers output classes with torch.utils._pytree (transformers'
# ModelOutput subclasses register themselves when defined). When a loaded program's input or
# output spec names a class that is not registered, the loader imports the module of this
# fixed list that defines it, and nothing else: the file never chooses which module is imported.
PYTREE_MODULES = ("transformers.modeling_outputs",)


def pytree_module(type_name: str) -> str | None:
    """The allow-listed module (PYTREE_MODULES' own string) that defines `type_name`, or None."""
    module = type_name.rpartition(".")[0]
    return next((m for m in PYTREE_MODULES if m == module), None)
