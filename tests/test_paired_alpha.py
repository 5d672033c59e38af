"""benchmarks/paired_alpha.py: one fusion at several weights, compared case by case."""

from __future__ import annotations

import pytest
import torch

from masr.dataset import PreparedData


def test_the_weights_end_at_the_parts_and_are_paired(planted: PreparedData) -> None:
    """α = 1 is the MDR part alone and α = 0 the MASS part alone (each evaluated by itself on
    the same cases), and each comparison with the base weight is the difference of the two."""
    from conftest import load_benchmark

    from masr.evaluate import evaluate_model
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    paired_alpha = load_benchmark("paired_alpha")
    torch.manual_seed(0)
    sizes = (planted.n_users, planted.n_playlists, planted.n_songs)
    mdr = MDR(MDRConfig(dim=8, init_std=0.3), *sizes).eval()
    mass = MASS(MASSConfig(dim=8, init_std=0.3), *sizes).eval()
    got = paired_alpha.compare(mdr, mass, planted, [0.0, 1.0], 0.5, "valid", 20)
    assert set(got["alpha"]) == {"0", "0.5", "1"}
    for name, part in (("1", mdr), ("0", mass)):
        alone = evaluate_model(part, planted, "valid", full_sample=20, sample_seed=0)
        for protocol in ("sampled", "full"):
            assert got["alpha"][name][protocol]["hit@10"] == pytest.approx(
                alone[protocol]["hit@10"], abs=1e-4
            ), (name, protocol)
    for name in ("0", "1"):
        for protocol in ("sampled", "full"):
            pair = got["against_base"][name][protocol]["hit@10"]
            base = got["alpha"]["0.5"][protocol]["hit@10"]
            assert pair["delta"] == pytest.approx(pair["a"] - pair["b"])
            assert pair["b"] == pytest.approx(base, abs=1e-4)
            assert 0.0 <= pair["p"] <= 1.0
    assert got["against_base"]["1"]["full"]["cases"] == 20
