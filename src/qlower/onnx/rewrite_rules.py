"""The onnxscript rewrite rules qlower runs on a translated cluster: the optimizer's default rules
less the inexact ones, each tried only at the nodes its pattern can start from.

onnxscript 0.7.2's rule set tries every rule at every node, and a rule whose pattern has several
output nodes (`SlicesSplit`) indexes the whole graph by op type on every try before it looks at
the node: one rewrite pass cost O(nodes^2) (measured on the AMD EPYC Zen 1: 2.4 s of a 10 s int8
compile of the zoo transformer, 266k node visits for a graph of ~360 nodes, 28,852 tries).
`RootFilteredRule` asks first the question the matcher asks first (does the root pattern node's
op type, then domain, match this node?) so a rule that cannot match is not tried; which rules
fire, and where, is unchanged (tests/test_rewrite_rules.py compares the rewritten models).
"""
from __future__ import annotations

import functools


class RootFilteredRule:
    """An onnxscript `RewriteRule` tried only at nodes that its pattern's first output node
    matches by op type and domain; every other attribute is the rule's own."""

    def __init__(self, rule):
        self.rule = rule
        root = rule._target_pattern.output_nodes[0]   # onnxscript 0.7.2 (pinned): the node matched first
        self._op, self._domain = root.op, root.domain

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def __str__(self) -> str:
        return str(self.rule)

    def can_start_at(self, node) -> bool:
        return self._op.matches(node.op_type) and self._domain.matches(node.domain)

    def try_rewrite(self, model, graph_or_function, node, **kwargs):
        if not self.can_start_at(node):
            return None
        return self.rule.try_rewrite(model, graph_or_function, node, **kwargs)


@functools.cache
def exact_rewrite_rules() -> tuple:
    """onnxscript's default rewrite rules less its arithmetic no-op rules, root-filtered: `x + 0`,
    `x - 0`, `x * 1`, `x / 1` match a constant within a tolerance, so `x + 3.4e-12` became
    Identity (measured: qlower's integer LayerNorm lost its variance epsilon and gave NaN on a
    constant row; found by the onnxruntime fuzz run), and a float64
    `x * (1 + 1e-9)` would become x. An exact no-op costs ONNX Runtime one elementwise kernel."""
    return tuple(RootFilteredRule(rule) for rule in _exact_rules())


def _exact_rules() -> tuple:
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import _no_op
    keep = {id(_no_op.dropout_zero_rule), id(_no_op.dropout_inference_rule)}
    inexact = {id(rule) for rule in _no_op.rules.rules} - keep   # (commute() makes new rules: by identity)
    return tuple(rule for rule in rewriter._DEFAULT_REWRITE_RULES if id(rule) not in inexact)
