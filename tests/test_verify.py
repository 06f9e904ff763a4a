"""`qlower verify` / `qlower.verify()`: per-layer table worst first, measured suggestions, the
self-contained HTML report, the CLI; a real browser renders the page under `-m slow`."""
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch
from typer.testing import CliRunner

import qlower
from qlower.cli import app
from qlower.report import VerifyReport, sqnr_db

DEAD = 5  # fc2's input channel that is always 0 (fc1 row DEAD is 0 with bias -1, then relu)


class BadWeights(torch.nn.Module):
    """LayerNorm -> fc1 -> relu -> fc2 -> relu -> fc3. fc2's weight column DEAD is 1000 while the
    others are ~0.1: in float it multiplies zeros and changes nothing, but each output channel's
    int8 scale is set by it (1000/127), so every other weight of fc2 rounds to 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(32)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 16)
        with torch.no_grad():
            self.fc1.weight[DEAD] = 0.0
            self.fc1.bias[DEAD] = -1.0
            self.fc2.weight[:, DEAD] = 1000.0

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(self.norm(x))))))


class OutlierMLP(torch.nn.Module):
    """RMSNorm whose channel 3 has a 40x weight -> gated MLP (as tests/test_accuracy.py): the
    activation feeding gate/up has one outlier channel, which SmoothQuant moves into the weights."""

    def __init__(self, width: int = 64, hidden: int = 128):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        weight = 1.0 + 0.1 * torch.randn(width, generator=g)
        weight[3] = 40.0
        self.norm_weight = torch.nn.Parameter(weight)
        self.gate, self.up, self.down = (torch.nn.Linear(width, hidden), torch.nn.Linear(width, hidden),
                                         torch.nn.Linear(hidden, width))
        with torch.no_grad():
            for lin in (self.gate, self.up, self.down):
                lin.weight.normal_(0, lin.in_features ** -0.5, generator=g)

    def forward(self, x):
        h = self.norm_weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def _batches(n: int, seed: int, shape) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g),) for _ in range(n)]


def _applied_sqnr(model, inputs, calibration, config) -> float:
    """What a user gets by applying a config: quantize, run the same inputs, compare."""
    qm = qlower.quantize(model, inputs[0], calibration, config).module()
    with torch.no_grad():
        return sqnr_db([model(*x) for x in inputs], [qm(*x) for x in inputs])


@pytest.fixture(scope="module")
def bad_report():
    model = BadWeights().eval()
    inputs, calibration = _batches(3, 1, (4, 32)), _batches(6, 2, (4, 32))
    report = qlower.verify(model, inputs, calibration, "int8", suggest=2, name="bad-weights")
    return model, inputs, calibration, report


def test_table_is_sorted_worst_first_and_the_bad_layer_leads(bad_report):
    _, _, _, report = bad_report
    assert isinstance(report, VerifyReport)
    assert [layer.module for layer in report.layers] and len(report.layers) == 3
    own = [layer.sqnr_db for layer in report.layers]
    assert own == sorted(own)
    worst = report.worst
    assert worst.module == "fc2" and worst.op == "linear" and worst.quantized
    assert worst.sqnr_db < 5 < 25 < min(layer.sqnr_db for layer in report.layers[1:])
    # the weight statistic names the cause: max|w| / median|w| of the worst output channel
    assert worst.weight is not None and worst.weight.peak_to_median > 1000
    assert all(layer.weight.peak_to_median < 20 for layer in report.layers[1:])
    # fc3's own error is small; in the quantized model it inherits fc2's
    fc3 = next(layer for layer in report.layers if layer.module == "fc3")
    assert fc3.sqnr_db > 25 and fc3.sqnr_db_in_model < 10
    # activation statistics of fc2's input: channel DEAD is all zeros, values are >= 0 (after relu)
    stats = report.stats["fc2"]
    assert stats.min == 0.0 and stats.max == stats.absmax > stats.p999 * 0.5 > 0
    assert stats.channel_ratio >= 1.0 and stats.kurtosis > 0
    text = str(report)
    assert text.index("fc2") < text.index("fc1") < text.index("fc3")


def test_bad_layer_is_suggested_for_float_with_the_gain_it_really_has(bad_report):
    model, inputs, calibration, report = bad_report
    best = report.suggestions[0]
    assert best.action == "keep_float" and best.modules == ("fc2",) and best.recommended
    assert best.config.keep_float == ("fc2",)
    assert best.gain_db > 20
    assert best.before.sqnr_db == pytest.approx(report.end_to_end.sqnr_db)
    # measured, not estimated: applying the suggestion gives exactly the reported SQNR
    assert _applied_sqnr(model, inputs, calibration, best.config) == pytest.approx(best.after.sqnr_db, abs=1e-9)
    assert _applied_sqnr(model, inputs, calibration, qlower.QuantConfig()) == \
        pytest.approx(report.end_to_end.sqnr_db, abs=1e-9)
    assert [s.gain_db for s in report.suggestions] == sorted((s.gain_db for s in report.suggestions), reverse=True)
    assert "QuantConfig(keep_float=('fc2',))" == best.code()


def test_smoothquant_suggestion_is_measured_on_an_outlier_channel():
    model = OutlierMLP().eval()
    inputs, calibration = _batches(4, 1, (1, 32, 64)), _batches(8, 0, (1, 32, 64))
    config = qlower.QuantConfig(requantize_outputs=False)
    report = qlower.verify(model, inputs, calibration, config, suggest=0)
    gate = next(layer for layer in report.layers if layer.module == "gate")
    assert gate.input.top_channel == 3 and gate.input.channel_ratio > 10
    sq = next(s for s in report.suggestions if s.action == "smoothquant_on")
    assert sq.recommended and sq.gain_db > 0.5  # measured 1.7 dB (19.1 -> 20.8)
    assert sq.config.smoothquant is not None
    assert _applied_sqnr(model, inputs, calibration, sq.config) == pytest.approx(sq.after.sqnr_db, abs=1e-9)


def test_verify_refuses_an_already_quantized_program():
    model, x = BadWeights().eval(), _batches(2, 1, (4, 32))
    program = qlower.quantize(model, x[0], x, "int8")
    with pytest.raises(qlower.InputError, match="already quantized"):
        qlower.verify(program, x)


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.cells, self.urls = [], [], [], []
        self._table = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id")
        if tag == "tr" and self._table == "layers":
            self.rows.append([])
        self.urls += [v for k, v in attrs.items() if k in ("href", "src", "xlink:href") and v]

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._table == "layers" and self.rows and data.strip():
            self.rows[-1].append(data.strip())


def test_html_is_one_self_contained_file_with_table_and_svg(bad_report, tmp_path):
    _, _, _, report = bad_report
    path = report.save_html(tmp_path / "report.html")
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"https?:|url\(|@import|<link|<script|<img|<iframe", text, re.I)  # nothing to fetch
    page = _Page()
    page.feed(text)
    page.close()
    assert not page.urls
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    assert page.tags.count("svg") >= 2 + len(report.layers)  # two charts and a bar in every row
    rows = [r for r in page.rows if r and r[0].isdigit()]
    assert [r[1] for r in rows] == [layer.label() for layer in report.layers]  # the table rows, worst first
    assert rows[0][1] == "fc2"
    assert "keep fc2 in float" in text and "recommended" in text


def test_cli_verify_writes_report_for_a_zoo_model(tmp_path):
    out, js = tmp_path / "report.html", tmp_path / "report.json"
    result = CliRunner().invoke(app, ["verify", "transformer", "--quantize", "transformer", "--out", str(out),
                                      "--json", str(js), "--calibration", "2", "--inputs", "1", "--suggest", "1",
                                      "--charts", str(tmp_path / "charts")])
    assert result.exit_code == 0, result.output
    assert out.exists() and "<svg" in out.read_text()
    assert "end to end (Q/DQ program vs float): SQNR" in result.output and f"wrote {out}" in result.output
    assert "Traceback" not in result.output and "Failed to load" not in result.output
    data = json.loads(js.read_text())
    assert len(data["layers"]) == 12 and data["suggestions"][0]["action"] == "keep_float"
    # the charts as standalone SVG files: well-formed XML in the SVG namespace, one bar per layer
    import xml.etree.ElementTree as ET
    for kind in ("layer-sqnr", "activation-ranges"):
        root = ET.parse(tmp_path / "charts" / f"report-{kind}.svg").getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", kind
        assert len(root.findall("{http://www.w3.org/2000/svg}rect")) >= 12, kind


def test_cli_verify_unknown_model_is_a_clean_error():
    result = CliRunner().invoke(app, ["verify", "resnet1000"])
    assert result.exit_code == 2 and "neither a zoo model nor a .pt2 file" in result.output
    assert "Traceback" not in result.output


def test_cli_verify_a_pt2_file_with_random_inputs(tmp_path):
    model = BadWeights().eval()
    path = qlower.save_pt2(qlower.capture(model, (torch.randn(4, 32),)), tmp_path / "bad.pt2")
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["verify", str(path), "--out", str(out), "--calibration", "4", "--inputs", "2",
                                      "--suggest", "1"])
    assert result.exit_code == 0, result.output
    assert "keep fc2 in float" in result.output and "random N(0, 1)" in out.read_text()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no browser: apt-get install chromium (Debian's package)")
def test_report_renders_in_headless_chromium(bad_report, tmp_path):
    """A real browser loads the page offline, builds the DOM (table rows, SVG) and paints it."""
    _, _, _, report = bad_report
    path = report.save_html(tmp_path / "report.html")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1800"]
    dom = subprocess.run(flags + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<svg" in dom and "<rect" in dom and 'id="layers"' in dom and "keep fc2 in float" in dom
    shot = tmp_path / "report.png"
    subprocess.run(flags + [f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000
    pil = pytest.importorskip("PIL.Image")
    image = pil.open(shot).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20)
    red = sum(n for n, (r, g, b) in colors if (r, g, b) == (0xc6, 0x28, 0x28))  # the bad layer's red bar / card
    green = sum(n for n, (r, g, b) in colors if (r, g, b) == (0x2e, 0x7d, 0x32))
    assert red > 50 and green > 500
