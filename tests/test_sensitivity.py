"""Per-layer sensitivity report and the keep_float / transformer recipe options."""
import pytest
import torch

import qlower
from qlower import zoo
from qlower.report import sensitivity, sqnr_db


@pytest.mark.slow
def test_sensitivity_ranks_every_layer_worst_first_and_keep_float_helps():
    entry = zoo.get("transformer")
    model, x = entry.model(), entry.inputs(1)
    layers = sensitivity(model, x, entry.calibration(4))
    assert len(layers) == 12  # 8 linears + 4 matmuls
    assert [layer.sqnr_db for layer in layers] == sorted(layer.sqnr_db for layer in layers)
    assert all(10 < layer.sqnr_db < 80 for layer in layers)
    worst = layers[0].module
    base = qlower.compile(model, x, quantize="int8", calibration=entry.calibration(4), backend="reference")
    kept = qlower.compile(model, x, quantize=qlower.QuantConfig(keep_float=(worst,)),
                          calibration=entry.calibration(4), backend="reference")
    lowered, total = kept.report().lowered_fraction()
    assert lowered < total  # the kept module's ops stayed float
    test = entry.inputs(1, seed=5)
    with torch.no_grad():
        want = model(*test)
    assert sqnr_db(want, kept(*test)) > sqnr_db(want, base(*test))


def test_transformer_preset_uses_histogram_observer():
    cfg = qlower.QuantConfig.from_name("transformer")
    assert cfg.observer == "histogram"
