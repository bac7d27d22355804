"""benchmarks/fp16_fft_emulation.py: float16 storage of LOCOST's convolution emulated on a CPU (the
error a GPU's float16 FFTs add at the least, issue 32)."""

import json

import pytest
import torch

from conftest import load_script
from lsg_layers.modules.s4d import S4D
from lsg_layers.ops.ssm import next_fast_len

pytestmark = pytest.mark.usefixtures("single_thread")

emulation = load_script("benchmarks/fp16_fft_emulation.py", "fp16_fft_emulation")


def test_rounding_to_float16_is_what_the_emulation_adds():
    z = torch.tensor([1.0 + 2.0**-12, 3.0])
    assert emulation.fp16(z).tolist() == [1.0, 3.0]  # below float16's last bit at 1: gone
    c = torch.complex(z, -z)
    assert emulation.fp16(c).imag.tolist() == [-1.0, -3.0]


def test_the_table_shows_float16_error_beside_bfloat16s(tmp_path):
    out = tmp_path / "e.json"
    emulation.main(["--lengths", "256", "--channels", "8", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    # bfloat16 output rounding sets the floor; float16 storage adds to it but stays near it
    assert 0 < row["model_vs_float64"] < 1e-2 and 0 < row["emulated_vs_float64"] < 1e-2
    assert 0 < row["emulated_vs_model"] < 1e-2
    assert row["fft_size"] == 512
    md = (tmp_path / "e.md").read_text()
    assert "| 256 | 512 |" in md and "fp16_fft_emulation.py --lengths 256 --channels 8" in md


def test_the_emulation_adds_float16s_error_where_float32_has_none():
    """In float32 end to end (no bfloat16 output rounding to hide behind), the layer's convolution
    is float64's to 1e-5 and the float16-storage emulation is off by float16's rounding (2^-11 of
    an entry at most, summed over the FFTs' passes): the emulation does round."""
    torch.manual_seed(0)
    layer = S4D(d_model=8, d_state=8).eval()
    L, F = 300, next_fast_len(600)
    k, q = torch.randn(1, L, 8), torch.randn(1, L, 8)
    with torch.no_grad():
        spec = layer.whole_spectrum(F)
        model = layer._whole_gated_convolution(k, q, F, k.dtype)
        emul = emulation.emulated(k, q, spec, F)
        exact = emulation.float64_convolution(k, q, spec, F)
    assert model.dtype == emul.dtype == torch.float32
    assert emulation.relative_difference(model.double(), exact) < 1e-5
    assert 1e-4 < emulation.relative_difference(emul.double(), exact) < 1e-2
