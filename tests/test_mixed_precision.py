"""Mixed precision to an accuracy target (QuantConfig(target=...), quantize/mixed_precision.py)."""
import pytest
import torch

import qlower
from qlower.quantize import PRECISION_CHOICE_KEY, AccuracyTarget, QuantConfig
from qlower.quantize.mixed_precision import measure


class Chain(torch.nn.Module):
    """Six linears; layer 3 gives one output channel a constant ~1000 (layer 4 reads it with a
    tiny weight), so the static per-tensor range of layer 4's input is wasted on that channel
    and the rest of it rounds to a few levels: a clear, known-sensitive spot."""
    def __init__(self):
        super().__init__()
        self.l = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(6)])
        with torch.no_grad():
            self.l[3].bias[0] = 1000.0
            self.l[4].weight[:, 0] /= 1000.0

    def forward(self, x):
        for layer in self.l:
            x = torch.relu(layer(x))
        return x


@pytest.fixture(scope="module")
def chain():
    torch.manual_seed(0)
    model = Chain().eval()
    g = torch.Generator().manual_seed(1)
    calibration = [(torch.randn(8, 32, generator=g),) for _ in range(4)]
    return model, calibration


def _choice(program):
    return program.graph_module.meta[PRECISION_CHOICE_KEY]


def test_target_met_by_int8_keeps_every_layer_int8(chain):
    model, cal = chain
    program = qlower.quantize(model, cal[0], cal, QuantConfig(target=AccuracyTarget(10.0)))
    choice = _choice(program)
    assert choice.met and choice.float_layers == () and choice.trials == []
    assert choice.measured == choice.all_int8 >= 10.0


@pytest.mark.slow
def test_missed_target_keeps_the_fewest_sensitive_layers_float(chain):
    model, cal = chain
    all_int8 = measure(AccuracyTarget(0.0), model, qlower.quantize(model, cal[0], cal, QuantConfig()).module(), cal)
    target = AccuracyTarget(all_int8 + 3.0)
    program = qlower.quantize(model, cal[0], cal, QuantConfig(target=target))
    choice = _choice(program)
    assert choice.met, str(choice)
    assert choice.float_layers == ("l.4",)   # the layer the model was built to break
    assert choice.measured > all_int8 + 20
    # the program returned is the one measured, and it is reproducible from the choice
    assert measure(target, model, program.module(), cal) == choice.measured
    again = qlower.quantize(model, cal[0], cal, QuantConfig(keep_float=choice.float_layers))
    assert measure(target, model, again.module(), cal) == choice.measured
    # fewest: the trial with one float layer fewer (when tried) missed the target
    fewer = [t for t in choice.trials if t.float_layers == len(choice.float_layers) - 1]
    assert all(not target.met(t.measured) for t in fewer)
    assert "mixed precision" in str(choice) and "float" in str(choice)


@pytest.mark.slow
def test_unreachable_target_within_bound_returns_best_and_says_not_met(chain):
    model, cal = chain
    choice = _choice(qlower.quantize(model, cal[0], cal,
                                     QuantConfig(target=AccuracyTarget(200.0, max_float_layers=1))))
    assert not choice.met and len(choice.float_layers) <= 1
    assert "NOT met" in str(choice)


def test_cosine_target_and_number_shorthand():
    assert QuantConfig(target=35).target == AccuracyTarget(35.0, "sqnr")
    cosine = AccuracyTarget(0.999, metric="cosine")
    assert cosine.met(0.9995) and not cosine.met(0.99)


@pytest.mark.parametrize("bad", [dict(value=1.5, metric="cosine"), dict(value=30, metric="snr"),
                                 dict(value=30, max_float_layers=-1)])
def test_bad_targets_are_typed_errors(bad):
    with pytest.raises(qlower.QlowerError):
        AccuracyTarget(**bad)


def test_target_must_be_a_target():
    with pytest.raises(qlower.QlowerError, match="AccuracyTarget"):
        QuantConfig(target="high")


def test_kept_float_layer_input_is_not_quantized(chain):
    """Keeping a layer float also leaves its input unrounded (the producer's output is not
    quantized just for it): otherwise the float layer would inherit the quantization error."""
    model, cal = chain
    program = qlower.quantize(model, cal[0], cal, QuantConfig(keep_float=("l.4",)))
    linears = [n for n in program.graph.nodes if n.target == torch.ops.aten.linear.default]
    kept = next(n for n in linears if "l.4" in str(n.meta.get("nn_module_stack", {})))
    x = kept.args[0]
    assert x.target == torch.ops.aten.relu.default  # relu of layer 3's float output, no DQ


def test_compile_report_states_the_choice(chain):
    model, cal = chain
    cm = qlower.compile(model, cal[0], quantize=QuantConfig(target=AccuracyTarget(30.0)), calibration=cal,
                        backend="reference")
    notes = "\n".join(cm.report().notes)
    assert "mixed precision (target sqnr >= 30 dB)" in notes and "l.4" in notes
    assert "mixed precision" in str(cm.report())
