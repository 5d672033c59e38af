"""Checkpoints: plain dicts of tensors and JSON-able values, loadable with weights_only=True.

Layout of a checkpoint dict (see docs/design.md, "Checkpoints"):
  format          int, CHECKPOINT_FORMAT
  model           registry name of the class ("mdr", "mass", "masr", "itemknn", ...)
  config          the model's config dataclass as a dict (rebuilds the model)
  sizes           {"n_users", "n_playlists", "n_songs"}
  state_dict      the model's tensors
  data_fingerprint  PreparedData.fingerprint of the data it was trained on
  masr_version    str
  ... plus whatever the caller adds (epoch, metrics, train_config, optimizer state for resume)
No pickled objects: every value is a tensor, a number, a string, a list or a dict of those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from masr import __version__
from masr.atomic import atomic_path
from masr.distributed import world
from masr.errors import MasrError
from masr.models import REGISTRY, model_class
from masr.models.base import Recommender

CHECKPOINT_FORMAT = 1


def save_checkpoint(
    path: str | Path, model: Recommender, *, data_fingerprint: str, **extra: Any
) -> None:
    """Write ``model`` and ``extra`` metadata to ``path`` atomically (rank 0 only under
    torchrun: the other ranks hold the same weights, ``masr.distributed``)."""
    if not world().is_main:
        return
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model": model.name,
        "config": model.config.to_dict(),
        "sizes": model.sizes(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "data_fingerprint": data_fingerprint,
        "masr_version": __version__,
        **extra,
    }
    try:
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)
    except (OSError, RuntimeError) as exc:  # torch's writer reports a full disk as RuntimeError
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
        else:
            reason = "the write failed; is the disk full? " + " ".join(str(exc).split())[:100]
        raise MasrError(
            f"{path}: could not save the checkpoint ({reason}); the previous file is unchanged"
        ) from None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint dict with ``weights_only=True`` (no code runs while loading)."""
    path = Path(path)
    if not path.is_file():
        raise MasrError(f"{path}: checkpoint not found")
    from masr.runs.store import checkpoint_damage

    damage = checkpoint_damage(path)
    if damage is not None:  # torch.load checks no CRC: changed bytes load as other weights
        raise MasrError(f"{path}: damaged ({damage}); not a readable masr checkpoint")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise MasrError(f"{path}: not a readable masr checkpoint ({type(exc).__name__})") from None
    if (
        not isinstance(ckpt, dict)
        or ckpt.get("format") != CHECKPOINT_FORMAT
        or ckpt.get("model") not in REGISTRY
    ):
        raise MasrError(f"{path}: not a masr checkpoint (format {CHECKPOINT_FORMAT})")
    return ckpt


def build_model(ckpt: dict[str, Any], device: torch.device | str = "cpu") -> Recommender:
    """Rebuild the model a checkpoint describes and load its tensors."""
    cls = model_class(ckpt["model"])
    config = cls.config_class(**ckpt["config"])
    model = cls(config, **ckpt["sizes"])
    model.load_state_dict(ckpt["state_dict"])
    model.data_fingerprint = ckpt.get("data_fingerprint")
    return model.to(device).eval()


def load_model(
    path: str | Path, device: torch.device | str = "cpu"
) -> tuple[Recommender, dict[str, Any]]:
    """``(model, checkpoint dict)`` from a checkpoint file."""
    ckpt = load_checkpoint(path)
    return build_model(ckpt, device), ckpt
