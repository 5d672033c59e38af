"""MASR: the fixed fusion of a pretrained MDR and MASS (paper section 4.3, eq. 20).

    o_MASR = α · o_MDR + (1 - α) · o_MASS                                        (eq. 20)

Both parts are distances (lower = better), so the fusion is one too. Nothing is trained: the
parts are pretrained (BPR or APR), frozen here, and the checkpoint of a MASR run holds both state
dicts (``mdr.*``, ``mass.*``) so it evaluates and exports on its own.

Public API:
    MASRConfig(alpha=0.5, mdr={...MDRConfig...}, mass={...MASSConfig...},
               parts={"mdr": "<run>", "mass": "<run>"})
    MASR(config, n_users, n_playlists, n_songs)        builds frozen, freshly initialised parts
    MASR.from_parts(mdr_model, mass_model, alpha=0.5, parts=None) -> MASR   copies their tensors;
        parts = {"mdr": run, "mass": run} or the pair (mdr_run, mass_run)
    MASR.distance(batch, songs (B, C)) -> (B, C)
    MASR.full_distance(batch, chunk=256) -> (B, V)
    MASR.full_distance_from_vectors(u_mdr, p_mdr, u_mass, u_mass_att, members, member_mask,
                                    chunk=1024) -> (B, V)
        eq. 20 from vectors (see MDR / MASS of the same name); the tests' PyTorch reference of
        the exported graph's fold-in.
    MASR.parts() -> (MDR, MASS)                         the frozen parts; ``masr.export`` reads
                                                        each one's ``export_weights()`` and
                                                        weights them by config.alpha
    MASR.with_alpha(alpha) -> MASR                      the same parts under another α
                                                        (masr export --alpha)
    fuse(alpha, o_mdr, o_mass) -> Tensor                eq. 20 on distances
    FusionOnMass(mdr, alpha)                            eq. 20 from given MASS distances
                                                        (``masr.evaluate.OnTop``)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from masr.config import ALPHA, check_alpha
from masr.errors import MasrError
from masr.models.base import Batch, ModelConfig, Recommender
from masr.models.mass import MASS, MASSConfig
from masr.models.mdr import MDR, MDRConfig


def fuse(alpha: float, o_mdr: Tensor, o_mass: Tensor) -> Tensor:
    """Eq. 20: o = α · o_MDR + (1 - α) · o_MASS."""
    return alpha * o_mdr + (1.0 - alpha) * o_mass  # eq. 20


class FusionOnMass:
    """Eq. 20 at weight ``alpha`` from a MASS model's distances, given (``evaluate.OnTop``):
    only the ``mdr`` part is computed. Evaluation scores a MASS run once and every fusion that
    holds it (or one fusion at several weights, ``masr train --alpha auto``) from it."""

    def __init__(self, mdr: MDR, alpha: float):
        self.mdr, self.alpha = mdr, check_alpha(alpha)

    @classmethod
    def of(cls, fused: MASR) -> FusionOnMass:
        return cls(fused.mdr, fused.config.alpha)

    def distance(self, batch: Batch, songs: Tensor, base: Tensor) -> Tensor:
        return fuse(self.alpha, self.mdr.distance(batch, songs), base)

    def full_distance(self, batch: Batch, base: Tensor) -> Tensor:
        return fuse(self.alpha, self.mdr.full_distance(batch), base)


def _part_names(parts: Mapping[str, str] | Sequence[str] | None) -> dict[str, str]:
    if parts is None:
        return {"mdr": "mdr", "mass": "mass"}
    if isinstance(parts, Mapping):
        names = {str(k): str(v) for k, v in parts.items()}
    else:
        names = dict(zip(("mdr", "mass"), map(str, parts), strict=True))
    if set(names) != {"mdr", "mass"}:
        raise MasrError(f"masr fusion parts: need an mdr and a mass run, got {names}")
    return names


@dataclass
class MASRConfig(ModelConfig):
    """MASR settings: the fusion weight and the configs (and run names) of its frozen parts."""

    #: --set cannot change these: α has --alpha, the rest is written by the fusion itself
    owned_fields: ClassVar[dict[str, str]] = {
        "alpha": "--alpha",
        "mdr": "",
        "mass": "",
        "parts": "",
    }

    alpha: float = ALPHA  # weight of MDR in eq. 20; MASS gets 1 - alpha
    mdr: dict[str, Any] = field(default_factory=lambda: MDRConfig().to_dict())
    mass: dict[str, Any] = field(default_factory=lambda: MASSConfig().to_dict())
    parts: dict[str, str] = field(default_factory=lambda: {"mdr": "mdr", "mass": "mass"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.alpha = check_alpha(self.alpha)


class MASR(Recommender):
    """α-weighted sum of a frozen MDR and a frozen MASS (eq. 20); no trainable parameters."""

    name = "masr"
    config_class = MASRConfig
    trainable = False
    uses_members = True

    def __init__(self, config: MASRConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        self.mdr = MDR(MDRConfig(**config.mdr), n_users, n_playlists, n_songs)
        self.mass = MASS(MASSConfig(**config.mass), n_users, n_playlists, n_songs)
        self.requires_grad_(False)  # pretrained parts stay fixed (paper, section 4.3)
        self.eval()

    @classmethod
    def from_parts(
        cls,
        mdr: MDR,
        mass: MASS,
        alpha: float = ALPHA,
        parts: Mapping[str, str] | Sequence[str] | None = None,
    ) -> MASR:
        """Fuse trained parts (their tensors are copied; the parts must share the data sizes).
        ``parts`` records the run names they came from: {"mdr": "amdr", "mass": "amass"} or
        the pair ("amdr", "amass") in (MDR, MASS) order."""
        if mdr.sizes() != mass.sizes():
            raise MasrError(
                f"masr fusion: mdr sizes {mdr.sizes()} differ from mass sizes {mass.sizes()}"
            )
        config = MASRConfig(
            alpha=alpha,
            mdr=mdr.config.to_dict(),
            mass=mass.config.to_dict(),
            parts=_part_names(parts),
        )
        like = next(mdr.parameters())
        model = cls(config, **mdr.sizes()).to(device=like.device, dtype=like.dtype)
        model.mdr.load_state_dict(mdr.state_dict())
        model.mass.load_state_dict(mass.state_dict())
        return model

    def with_alpha(self, alpha: float) -> MASR:
        """A copy sharing nothing mutable but weighting the parts by another ``alpha``."""
        return MASR.from_parts(self.mdr, self.mass, alpha, self.config.parts)

    def parts(self) -> tuple[MDR, MASS]:
        """The frozen parts (MDR, MASS) that eq. 20 weights by α and 1 - α."""
        return self.mdr, self.mass

    def compile_scores(self, on: bool) -> bool:
        """Its MASS part's compiled scores (MDR's full ranking is one GEMM already)."""
        return self.mass.compile_scores(on)

    def train(self, mode: bool = True) -> MASR:
        """MASR is never trained: its parts always run in eval mode (no dropout)."""
        return super().train(False)

    def fit(self, data: Any, device: Any) -> None:
        """Nothing to fit: MASR only combines its pretrained parts (eq. 20)."""

    def embedding_tables(self) -> set[str]:
        return set()  # nothing is trained, nothing is perturbed

    def fuse(self, o_mdr: Tensor, o_mass: Tensor) -> Tensor:
        """Eq. 20 from the parts' distances (any matching shapes): evaluation fuses a MASS run's
        distances, computed once, with each fusion that holds that MASS."""
        return fuse(self.config.alpha, o_mdr, o_mass)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, C) eq. 20 for each row's candidate ``songs``."""
        return self.fuse(self.mdr.distance(batch, songs), self.mass.distance(batch, songs))

    def full_distance(self, batch: Batch, chunk: int = 256) -> Tensor:
        """(B, V) eq. 20 against every catalog song (both parts in GEMM form)."""
        return self.fuse(self.mdr.full_distance(batch), self.mass.full_distance(batch, chunk))

    def full_distance_from_vectors(
        self,
        u_mdr: Tensor,
        p_mdr: Tensor,
        u_mass: Tensor,
        u_mass_att: Tensor,
        members: Tensor,
        member_mask: Tensor,
        chunk: int = 1024,
    ) -> Tensor:
        """(B, V) eq. 20 from vectors: MDR's user and playlist vectors (B, d), MASS's output and
        attention user vectors (B, d), member song indices (B, L) and their mask (B, L)."""
        o_mdr = self.mdr.full_distance_from_vectors(u_mdr, p_mdr)
        o_mass = self.mass.full_distance_from_vectors(
            u_mass, u_mass_att, members, member_mask, chunk
        )
        return self.fuse(o_mdr, o_mass)
