"""The models' vector entry points trace to ONNX with dynamic batch and member counts, and
ONNX Runtime gives the PyTorch distances (empty member lists included)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from masr.models.mass import MASS, MASSConfig
from masr.models.mdr import MDR, MDRConfig

N_USERS, N_PLAYLISTS, N_SONGS, DIM = 6, 7, 50, 8


class _MassVectors(torch.nn.Module):
    def __init__(self, model: MASS) -> None:
        super().__init__()
        self.model = model

    def forward(self, u, u_att, members, member_mask):  # noqa: ANN001, ANN201
        return self.model.full_distance_from_vectors(u, u_att, members, member_mask, chunk=16)


class _MdrVectors(torch.nn.Module):
    def __init__(self, model: MDR) -> None:
        super().__init__()
        self.model = model

    def forward(self, u, p):  # noqa: ANN001, ANN201
        return self.model.full_distance_from_vectors(u, p)


def _export(
    module: torch.nn.Module, args: tuple, names: list[str], dyn: dict, path: Path
) -> ort.InferenceSession:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=names,
            output_names=["o"],
            dynamic_axes=dyn,
            dynamo=False,
        )
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model.eval()


def test_mass_full_distance_from_vectors_exports_with_dynamic_shapes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _perturbed(MASS(MASSConfig(dim=DIM), N_USERS, N_PLAYLISTS, N_SONGS))
    b, l_dim = {0: "batch"}, {0: "batch", 1: "members"}
    example = (
        torch.randn(2, DIM),
        torch.randn(2, DIM),
        torch.zeros(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.bool),
    )
    session = _export(
        _MassVectors(model),
        example,
        ["u", "u_att", "members", "member_mask"],
        {"u": b, "u_att": b, "members": l_dim, "member_mask": l_dim},
        tmp_path / "mass.onnx",
    )
    gen = torch.Generator().manual_seed(1)
    for rows, slots in ((3, 4), (5, 9), (1, 1)):
        u, u_att = torch.randn(rows, DIM, generator=gen), torch.randn(rows, DIM, generator=gen)
        members = torch.randint(0, N_SONGS, (rows, slots), generator=gen)
        mask = torch.rand(rows, slots, generator=gen) < 0.6
        mask[0] = False  # an empty playlist: the song bias alone
        got = session.run(
            None,
            {
                "u": u.numpy(),
                "u_att": u_att.numpy(),
                "members": members.numpy(),
                "member_mask": mask.numpy(),
            },
        )[0]
        with torch.no_grad():
            want = model.full_distance_from_vectors(u, u_att, members, mask).numpy()
        assert got.shape == (rows, N_SONGS) and np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 4])
def test_mdr_full_distance_from_vectors_exports_with_dynamic_batch(
    tmp_path: Path, rows: int
) -> None:
    torch.manual_seed(0)
    model = _perturbed(MDR(MDRConfig(dim=DIM), N_USERS, N_PLAYLISTS, N_SONGS))
    session = _export(
        _MdrVectors(model),
        (torch.randn(2, DIM), torch.randn(2, DIM)),
        ["u", "p"],
        {"u": {0: "batch"}, "p": {0: "batch"}},
        tmp_path / "mdr.onnx",
    )
    u, p = torch.randn(rows, DIM), torch.randn(rows, DIM)
    got = session.run(None, {"u": u.numpy(), "p": p.numpy()})[0]
    with torch.no_grad():
        want = model.full_distance_from_vectors(u, p).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
