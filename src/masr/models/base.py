"""The one scoring contract every masr model implements (MDR, MASS, MASR and all baselines).

A model maps a batch of (user, playlist, member songs) and candidate songs to *distances*:
lower is better, as in the paper's eqs. 11, 19-21. Training (BPR/APR) and evaluation (sampled
and full ranking) are written once against this contract. Export reads the paper's models
through their own public ``export_weights`` (MDR, MASS) and ``parts`` (MASR), never through
their attributes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from masr.dataset import PreparedData
    from masr.sampling import TrainingIndex


@dataclass
class Batch:
    """Who the songs are for. Shapes: B rows, L member slots.

    ``source`` and ``rows`` are optional context for the models that read more than the member
    set (the sequential baselines' previous songs, CMN's neighbourhoods): the training index the
    batch was built from and, for training batches, the training row of each batch row (None
    when whole playlists are scored). ``masr.sampling`` fills them; other models ignore them."""

    users: Tensor  # (B,) long user index
    playlists: Tensor  # (B,) long playlist index
    members: Tensor  # (B, L) long member songs; padded slots hold any valid index (0)
    member_mask: Tensor  # (B, L) bool, True where the slot is a real member
    source: TrainingIndex | None = None  # the training interactions (on their own device)
    rows: Tensor | None = None  # (B,) long training row of each batch row; None: scoring

    def select(self, rows: slice | Tensor) -> Batch:
        """The batch's ``rows`` (a slice or an index tensor), same source."""
        return Batch(
            self.users[rows],
            self.playlists[rows],
            self.members[rows],
            self.member_mask[rows],
            self.source,
            None if self.rows is None else self.rows[rows],
        )

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.users.to(device),
            self.playlists.to(device),
            self.members.to(device),
            self.member_mask.to(device),
            self.source,
            None if self.rows is None else self.rows.to(device),
        )


@dataclass
class ModelConfig:
    """Base of every model's typed config; saved in checkpoints and ONNX metadata."""

    #: fields that ``masr train --set`` must not change: field -> the dedicated option that owns
    #: it (e.g. the fusions' ``alpha`` -> ``--alpha``), or "" for a field set by masr itself
    owned_fields: ClassVar[dict[str, str]] = {}
    #: other names ``masr train --set`` accepts for a field: the paper's symbol -> the field
    #: (e.g. Caser's ``L`` -> ``window``)
    setting_aliases: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        # a config built in Python (no command line parsed its values): text where a number
        # belongs is one line naming the setting here, not a TypeError deep inside training
        from masr.config import MODEL_OPTIONS, check_kinds

        check_kinds(self, {f: f"--{f}" if f in MODEL_OPTIONS else f"--set {f}="
                           for f in self.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Recommender(nn.Module):
    """Base class. Subclasses set ``name`` and ``config_class`` and implement ``distance``."""

    name: ClassVar[str]
    config_class: ClassVar[type[ModelConfig]]
    #: False for closed-form models (pop, itemknn, ease, als): ``fit`` replaces gradient training.
    trainable: ClassVar[bool] = True
    #: True when ``distance`` reads the member songs (MASS, FISM, item-kNN ...).
    uses_members: ClassVar[bool] = False
    #: Training objective: "bpr" (eq. 21) or "hinge" (CML's margin loss, with ``margin`` in config).
    loss: ClassVar[str] = "bpr"
    #: the fingerprint of the prepared data the weights were trained on, for a model rebuilt
    #: from a checkpoint (``masr.checkpoint.build_model``); ``evaluate_model`` refuses other
    #: data with it. None: not known (a model built in this process).
    data_fingerprint: str | None = None

    def __init__(self, config: ModelConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__()
        self.config = config
        self.n_users, self.n_playlists, self.n_songs = n_users, n_playlists, n_songs

    def sizes(self) -> dict[str, int]:
        return {"n_users": self.n_users, "n_playlists": self.n_playlists, "n_songs": self.n_songs}

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, C) distances from each row's context to its candidate ``songs`` (B, C)."""
        raise NotImplementedError

    def distance_shared(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, N) distances of every row to the same ``songs`` (N,): the negatives a batch
        shares under sampled softmax. Models override it where sharing saves work; the default
        is ``distance`` with the songs repeated for every row (same values, same dropout law)."""
        return self.distance(batch, songs.unsqueeze(0).expand(batch.users.shape[0], -1))

    def distance_own_shared(self, batch: Batch, own: Tensor, shared: Tensor) -> Tensor:
        """(B, 1 + N) distances of every row to its own song ``own`` (B,) (column 0) and to the
        ``shared`` songs (N,) (sampled softmax's positive and negatives). The default is
        ``distance`` and ``distance_shared``; a model overrides it to share the work of the
        two (MASS: its member-song terms, computed once)."""
        return torch.cat(
            [self.distance(batch, own.unsqueeze(1)), self.distance_shared(batch, shared)], dim=1
        )

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        """(B, V) distances to every catalog song. Models override this with a GEMM form;
        the default evaluates ``distance`` over song chunks."""
        device = batch.users.device
        out = []
        for start in range(0, self.n_songs, chunk):
            songs = torch.arange(start, min(start + chunk, self.n_songs), device=device)
            out.append(self.distance(batch, songs.expand(batch.users.shape[0], -1)))
        return torch.cat(out, dim=1)

    def fit(self, data: PreparedData, device: torch.device) -> None:
        """Closed-form models compute their parameters here (``trainable = False``)."""
        raise NotImplementedError(f"{self.name} is trained by gradient descent, not fit()")

    def after_step(self) -> None:
        """Called after every optimiser step (CML clips norms here). Default: nothing."""

    def init_from_data(self, data: PreparedData, seed: int = 0) -> None:
        """Start a fresh run's weights from the training data where the config asks for it
        (MASS's ``song_init="svd"``, ``masr.spectral``); called once, before training, and
        never for a resumed run or an APR run (they start from checkpoints). Default: nothing."""

    def compile_scores(self, on: bool) -> bool:
        """Switch the model's GEMM-form scores to a ``torch.compile``d version
        (``masr.compiled``), or back; True where the model has one (MASS: the shared-negative
        scores of training and the full ranking of validation and evaluation). Default: none."""
        return False

    def embedding_tables(self) -> set[str]:
        """Parameter names perturbed per row in APR (eq. 24); the rest are perturbed per tensor."""
        return {
            f"{mod_name}.weight" if mod_name else "weight"
            for mod_name, mod in self.named_modules()
            if isinstance(mod, nn.Embedding)
        }
