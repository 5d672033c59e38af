"""The ablations of the paper's Tables 3-4 (MDR_us/_ps, MASS_ps/_ups, MASS's attention
variants) against slow, obvious float64 references; their runs; the default models untouched."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_models import (
    N_PLAYLISTS,
    N_SONGS,
    N_USERS,
    all_songs,
    candidates,
    make_batch,
    make_mass,
    make_mdr,
    ref_query,
    ref_sq_dist,
)
from typer.testing import CliRunner

from masr.config import RunOptions
from masr.errors import MasrError
from masr.models.base import Batch
from masr.models.mass import ATTENTIONS, MASS, MASS_CONTEXTS, MASSConfig
from masr.models.mdr import MDR, MDRConfig
from masr.runs.registry import RUNS, model_config, plan, run_order, signature
from masr_cli.main import app

VARIANTS = [(c, a) for c in MASS_CONTEXTS for a in ATTENTIONS]


def _row(t: torch.nn.Embedding | None, i: int) -> list[float]:
    return [] if t is None else t.weight[i].tolist()


# --- slow references ---------------------------------------------------------------------
def ref_mdr_terms(model: MDR, batch: Batch, songs: torch.Tensor) -> list[list[float]]:
    """Eq. 11 with the kept terms only: o = [|B1⊙(u-s)|²] + [|B2⊙(p-s)|²] + θ_s."""
    out = []
    for r in range(songs.shape[0]):
        row = []
        for k in songs[r].tolist():
            s = model.song_emb.weight[k].tolist()
            o = model.song_bias.weight[k, 0].item()
            if "u" in model.config.terms:
                o += ref_sq_dist(
                    model.metric_user.tolist(), model.user_emb.weight[batch.users[r]].tolist(), s
                )
            if "p" in model.config.terms:
                p = model.playlist_emb.weight[batch.playlists[r]].tolist()
                o += ref_sq_dist(model.metric_playlist.tolist(), p, s)
            row.append(o)
        out.append(row)
    return out


def ref_mass_variant(model: MASS, batch: Batch, r: int, k: int) -> tuple[list[float], float]:
    """(α over the real members, o) of row r and candidate k, one number at a time: the
    context c is [u], [p] or [u; p]; "mem" reads the attention memory, "nonmem" the output
    tables; "metric" logits are -|B4⊙(q^(a) - s_t^(a))|², "dot" q^(a)·s_t^(a); "none" equal."""
    cfg = model.config
    user, playlist = int(batch.users[r]), int(batch.playlists[r])
    real = [
        int(t)
        for t, keep in zip(batch.members[r].tolist(), batch.member_mask[r].tolist(), strict=True)
        if keep
    ]
    c = _row(model.user_emb, user) + _row(model.playlist_emb, playlist)
    q = ref_query(model.query, c, model.song_emb.weight[k].tolist())  # eq. 12
    d_out = [ref_sq_dist(model.metric.tolist(), q, model.song_emb.weight[t].tolist()) for t in real]
    if cfg.attention == "none":
        alpha = [1.0 / len(real)] * len(real)
    else:
        mem = cfg.attention.startswith("mem-")
        u_t, p_t = (
            (model.att_user_emb, model.att_playlist_emb) if mem
            else (model.user_emb, model.playlist_emb)
        )
        s_t = model.att_song_emb if mem else model.song_emb
        c_att = _row(u_t, user) + _row(p_t, playlist)
        q_att = ref_query(model.att_query, c_att, s_t.weight[k].tolist())  # eq. 16
        if cfg.attention.endswith("-metric"):
            b4 = model.att_metric.tolist()
            logits = [-ref_sq_dist(b4, q_att, s_t.weight[t].tolist()) for t in real]  # eq. 17
        else:
            logits = [
                sum(a * b for a, b in zip(q_att, s_t.weight[t].tolist(), strict=True))
                for t in real
            ]
        top = max(logits)
        expo = [math.exp(x - top) for x in logits]
        alpha = [e / sum(expo) for e in expo]  # eq. 18
    o = sum(a * x for a, x in zip(alpha, d_out, strict=True)) + model.song_bias.weight[k, 0].item()
    return alpha, o  # eq. 19


# --- MDR_us / MDR_ps ---------------------------------------------------------------------
@pytest.mark.parametrize("terms", ["ups", "us", "ps"])
def test_mdr_terms_match_eq_11_in_every_form(terms: str) -> None:
    model, batch = make_mdr(terms=terms), make_batch(seed=2)
    songs = candidates(batch)
    with torch.no_grad():
        got = model.distance(batch, songs)
        full = model.full_distance(batch)
        shared = model.distance_shared(batch, songs[0])
    ref = torch.tensor(ref_mdr_terms(model, batch, songs), dtype=got.dtype)
    assert torch.allclose(got, ref, atol=1e-9)
    assert torch.allclose(full, model.distance(batch, all_songs(batch)), atol=1e-9)
    assert torch.allclose(shared, model.distance(batch, songs[0].expand(6, -1)), atol=1e-9)


def test_mdr_ablations_have_only_their_tables() -> None:
    us = MDR(MDRConfig(dim=4, terms="us"), N_USERS, N_PLAYLISTS, N_SONGS)
    ps = MDR(MDRConfig(dim=4, terms="ps"), N_USERS, N_PLAYLISTS, N_SONGS)
    assert {n.split(".")[0] for n, _ in us.named_parameters()} == {
        "user_emb", "song_emb", "song_bias", "metric_user"
    }
    assert {n.split(".")[0] for n, _ in ps.named_parameters()} == {
        "playlist_emb", "song_emb", "song_bias", "metric_playlist"
    }
    with pytest.raises(MasrError, match="terms=us: only the paper's MDR"):
        us.export_weights()
    with pytest.raises(MasrError, match="terms"):
        MDRConfig(terms="u")


# --- MASS contexts x attentions ----------------------------------------------------------
@pytest.mark.parametrize(("context", "attention"), VARIANTS)
def test_mass_variant_matches_its_equations(context: str, attention: str) -> None:
    model = make_mass(seed=1, context=context, attention=attention)
    batch = make_batch(seed=4)
    songs = candidates(batch)
    with torch.no_grad():
        got = model.distance(batch, songs)
        alpha = model.attention(batch, songs)
    for r in range(songs.shape[0]):
        slots = [t for t in range(batch.members.shape[1]) if batch.member_mask[r, t]]
        for c, k in enumerate(songs[r].tolist()):
            if not slots:  # a member-less row: the song bias alone
                assert got[r, c].item() == pytest.approx(model.song_bias.weight[k, 0].item())
                continue
            ref_alpha, ref_o = ref_mass_variant(model, batch, r, k)
            assert alpha[r, c, slots].tolist() == pytest.approx(ref_alpha, abs=1e-10)
            assert got[r, c].item() == pytest.approx(ref_o, abs=1e-9)


@pytest.mark.parametrize(("context", "attention"), VARIANTS)
def test_mass_variant_gemm_forms_equal_distance(context: str, attention: str) -> None:
    """full_distance (grouped by context), full_distance_grouped and distance_shared all run
    the GEMM core: equal to the plain distance for every variant."""
    model = make_mass(seed=2, context=context, attention=attention)
    batch = make_batch(seed=5, rows=8)
    songs = candidates(batch, n=5)
    with torch.no_grad():
        plain = model.distance(batch, all_songs(batch))
        full = model.full_distance(batch, chunk=7)
        shared = model.distance_shared(batch, songs[0])
        plain_shared = model.distance(batch, songs[0].expand(8, -1))
    assert torch.allclose(full, plain, atol=1e-9)
    assert torch.allclose(shared, plain_shared, atol=1e-9)


def test_mass_variants_have_only_their_tables() -> None:
    def names(**kw: str) -> set[str]:
        model = MASS(MASSConfig(dim=4, **kw), N_USERS, N_PLAYLISTS, N_SONGS)
        return {n.split(".")[0] for n, _ in model.named_parameters()}

    default = {
        "user_emb", "song_emb", "query", "metric", "song_bias",
        "att_user_emb", "att_song_emb", "att_query", "att_metric",
    }
    assert names() == default
    assert names(context="playlist") == default - {"user_emb", "att_user_emb"} | {
        "playlist_emb", "att_playlist_emb"
    }
    assert names(context="user+playlist") == default | {"playlist_emb", "att_playlist_emb"}
    assert names(attention="mem-dot") == default - {"att_metric"}
    assert names(attention="nonmem-metric") == default - {"att_user_emb", "att_song_emb"}
    assert names(attention="none") == {"user_emb", "song_emb", "query", "metric", "song_bias"}
    with pytest.raises(MasrError, match="attention"):
        MASSConfig(attention="dot")


def test_mass_ups_reference_init_starts_from_the_mean_context() -> None:
    model = MASS(MASSConfig(dim=3, context="user+playlist"), N_USERS, N_PLAYLISTS, N_SONGS)
    eye = torch.eye(3)
    assert torch.equal(model.query.weight, torch.cat([-eye / 2, -eye / 2, eye], dim=1))


def test_mass_attention_none_gives_equal_weights_to_real_members() -> None:
    model = make_mass(attention="none")
    batch = make_batch(seed=6)
    alpha = model.attention(batch, candidates(batch))
    real = batch.member_mask.sum(1, keepdim=True).clamp_min(1).double()
    expect = batch.member_mask.double() / real
    assert torch.allclose(alpha, expect.unsqueeze(1).expand_as(alpha))


# --- runs ---------------------------------------------------------------------------------
def test_ablation_runs_fix_their_settings() -> None:
    assert RUNS["mdr_us"].model == "mdr" and plan("mdr_us") == ["mdr_us"]
    assert model_config("mdr_us", {}).terms == "us"
    assert model_config("mdr_ps", {"dim": 8}).to_dict()["dim"] == 8
    assert model_config("mass_ups", {}).context == "user+playlist"
    assert model_config("mass_ps", {"attention": "mem-dot"}).attention == "mem-dot"
    assert model_config("mdr", {}).terms == "ups"  # the paper's MDR is MDR_ups
    with pytest.raises(MasrError, match="fixes terms=us"):
        model_config("mdr_us", {"terms": "ps"})
    options = RunOptions()
    sig = signature("mass_ps", options, "fp")
    assert sig["settings"] == {"context": "playlist"}
    assert sig["model_config"]["context"] == "playlist"
    assert "settings" not in signature("mass", options, "fp")  # old runs stay reusable
    assert run_order(["mass_ps", "mdr", "pop", "mdr_us"]) == ["pop", "mdr", "mdr_us", "mass_ps"]


def test_table_rows_keep_ablations_out_of_the_baselines() -> None:
    from masr.report import comparison_rows

    m = {"sampled": {"hit@10": 0.5, "ndcg@10": 0.3}, "full": {"hit@10": 0.2, "ndcg@10": 0.1}}
    rows = comparison_rows({"pop": m, "mdr": m, "masr": m, "mdr_us": m, "mass_ps": m})
    groups = {r.run: r.group for r in rows}
    assert groups["mdr_us"] == groups["mass_ps"] == "ablation"
    assert [r.label for r in rows if r.group == "ablation"] == ["MDR_us", "MASS_ps"]


def test_train_ablation_and_attention_variant_then_export_refuses(planted_dir: Path) -> None:
    runner = CliRunner()
    runs = planted_dir.parent / "runs"
    common = ["--data", str(planted_dir), "--runs", str(runs), "--epochs", "1", "--dim", "8"]
    for args in (["--model", "mass_ps"], ["--model", "mass", "--set", "attention=nonmem-dot"]):
        result = runner.invoke(app, ["train", *args, *common])
        assert result.exit_code == 0, (result.stderr, result.exception)
    assert (runs / "mass_ps" / "best.pt").is_file()
    result = runner.invoke(
        app, ["export", "--runs", str(runs), "--model", "mass", "--out", str(runs / "m.onnx")]
    )
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("masr: error:")]
    assert len(errors) == 1 and "only the paper's MASS" in errors[0], result.stderr
    assert result.stderr.rstrip().endswith("exports to ONNX")
    assert not (runs / "m.onnx").exists()
    result = runner.invoke(app, ["train", "--model", "mdr_us", "--set", "terms=ps", *common])
    assert result.exit_code == 1 and "fixes terms=us" in result.stderr
