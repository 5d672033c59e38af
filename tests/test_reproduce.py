"""The analyses (Figures 5-7) and `masr reproduce` end to end on tiny planted data."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from masr.analyze import (
    AttentionPairs,
    attention_correlation,
    embedding_size,
    epoch_seconds,
    pmi_attentive_scores,
)
from masr.dataset import PreparedData, load_prepared
from masr.errors import MasrError
from masr_cli.main import app

runner = CliRunner()


def _invoke(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stderr


def test_pmi_attentive_scores_match_a_loop_over_playlists(planted: PreparedData) -> None:
    cases, members_of, scores_of = pmi_attentive_scores(planted, "test", max_cases=0)
    sets = [
        set(planted.train_song[planted.indptr[p] : planted.indptr[p + 1]].tolist())
        for p in range(planted.n_playlists)
    ]
    n = len(sets)
    assert len(cases) > 0
    for i, members, scores in zip(cases, members_of, scores_of, strict=True):
        k = int(planted.test.song[i])
        pmi = []
        for t in members.tolist():
            both = sum(1 for s in sets if k in s and t in s)
            p_k = sum(1 for s in sets if k in s) / n
            p_t = sum(1 for s in sets if t in s) / n
            pmi.append(math.log(both / n / (p_k * p_t)) if both else -math.inf)
        top = max(x for x in pmi if x > -math.inf)
        expo = [math.exp(x - top) if x > -math.inf else 0.0 for x in pmi]
        assert scores.tolist() == pytest.approx([e / sum(expo) for e in expo], abs=1e-12)


def _slow_pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def _softmax_cases(rng: np.random.Generator, lengths: list[int]) -> np.ndarray:
    parts = [np.exp(rng.normal(size=n)) for n in lengths]
    return np.concatenate([p / p.sum() for p in parts])


def test_attention_rho_within_cases_against_a_slow_reference() -> None:
    rng = np.random.default_rng(3)
    lengths = [2, 5, 3, 9, 1, 4, 7]
    case = np.repeat(np.arange(len(lengths)), lengths)
    pmi = _softmax_cases(rng, lengths)
    weight = _softmax_cases(rng, lengths).astype(np.float32)  # α comes as float32
    pairs = AttentionPairs("x", "runs/x", pmi, weight, len(lengths), case)
    assert pairs.pearson == pytest.approx(_slow_pearson(pmi.tolist(), weight.tolist()), abs=1e-6)
    # within: each value minus its case's mean, which is 1/|members| on both sides
    dev_p, dev_w = [], []
    for c, n in enumerate(lengths):
        dev_p += [float(v) - 1 / n for v in pmi[case == c]]
        dev_w += [float(v) - 1 / n for v in weight[case == c]]
    assert pairs.pearson_within == pytest.approx(_slow_pearson(dev_p, dev_w), abs=1e-6)


def test_bootstrap_resamples_whole_cases() -> None:
    rng = np.random.default_rng(5)
    lengths = [3, 1, 4, 6, 2]
    case = np.repeat(np.arange(len(lengths)), lengths)
    pmi = _softmax_cases(rng, lengths)
    pairs = AttentionPairs("x", "r", pmi, _softmax_cases(rng, lengths), len(lengths), case)
    for _ in range(20):
        q = pairs.resampled(rng)
        assert q.cases == pairs.cases and np.all(np.diff(q.case) >= 0)
        for c in range(q.cases):  # each drawn case is one whole original case, in slot order
            slots = q.pmi[q.case == c]
            source = [o for o, n in enumerate(lengths) if n == len(slots)
                      and np.array_equal(pmi[case == o], slots)]
            assert len(source) == 1
            assert np.array_equal(q.weight[q.case == c], pairs.weight[case == source[0]])
    se, se_within = pairs.standard_errors(100, seed=1)
    assert 0 < se < 1 and 0 < se_within < 1
    assert pairs.standard_errors(100, seed=1) == (se, se_within)  # seeded
    row = pairs.summary(100, seed=1)
    assert row["pearson_se"] == pytest.approx(se, abs=1e-6) and row["resamples"] == 100
    assert "pearson_se" not in pairs.summary()
    one = AttentionPairs("x", "r", pmi[case == 2], pairs.weight[case == 2], 1,
                         np.zeros(lengths[2], dtype=case.dtype))
    assert all(np.isnan(e) for e in one.standard_errors(100, seed=1))  # one case: no spread


def test_equal_weights_follow_the_member_count_only() -> None:
    """Attention "none" (α = 1/|members|) scores well on the pooled ρ of the paper's Figure 6
    because the PMI softmax shares its per-case mean; within cases it has no ρ at all."""
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(1, 30, size=200)]
    case = np.repeat(np.arange(len(lengths)), lengths)
    pmi = _softmax_cases(rng, lengths)
    equal = np.concatenate([np.full(n, 1 / n, np.float32) for n in lengths])
    pairs = AttentionPairs("none", "runs/mass", pmi, equal, len(lengths), case)
    assert pairs.pearson > 0.3
    assert np.isnan(pairs.pearson_within)
    assert pairs.summary()["pearson_within"] is None and pairs.summary()["pearson"] > 0.3
    # a model that weights exactly as PMI does: ρ = 1 both ways
    same = AttentionPairs("pmi", "runs/mass", pmi, pmi.astype(np.float32), len(lengths), case)
    assert same.pearson == pytest.approx(1, abs=1e-6)
    assert same.pearson_within == pytest.approx(1, abs=1e-6)


def test_analyze_attention_and_speed_on_tiny_runs(planted_dir: Path, tmp_path: Path) -> None:
    runs, runs_dot = tmp_path / "runs", tmp_path / "runs-dot"
    common = ["--data", str(planted_dir), "--epochs", "2", "--dim", "8", "--device", "cpu"]
    _invoke(["train", "--model", "mass", "--runs", str(runs), *common])
    _invoke(["train", "--model", "mass", "--runs", str(runs_dot), "--set", "attention=mem-dot",
             *common])
    out = tmp_path / "analysis"
    _invoke(["analyze", "attention", "--data", str(planted_dir), "--runs", str(runs / "mass"),
             "--runs", str(runs_dot / "mass"), "--out", str(out), "--cases", "0",
             "--threads", "1"])
    table = json.loads((out / "attention.json").read_text())
    assert set(table) == {"mem-metric", "mem-dot"}
    assert all(-1 <= v["pearson"] <= 1 and v["pairs"] > v["cases"] > 0 for v in table.values())
    assert all(-1 <= v["pearson_within"] <= 1 and v["pearson_se"] > 0 for v in table.values())
    assert (out / "attention.png").stat().st_size > 0
    # the same numbers from the library, and α sums to 1 over each case's members
    data = load_prepared(planted_dir)
    pairs = attention_correlation(data, [runs / "mass"], max_cases=0)[0]
    assert pairs.pearson == pytest.approx(table["mem-metric"]["pearson"], abs=1e-6)
    assert pairs.pearson_within == pytest.approx(table["mem-metric"]["pearson_within"], abs=1e-6)
    assert pairs.case.tolist() == sorted(pairs.case.tolist()) and pairs.case[-1] == pairs.cases - 1
    assert np.isclose(pairs.weight.sum(), pairs.cases)
    _invoke(["analyze", "speed", "--runs", str(runs), "--out", str(out)])
    speed = json.loads((out / "speed.json").read_text())
    (tmp_path / "afile").write_text("x")  # a file where the folder goes: one line, no work
    refused = runner.invoke(app, ["analyze", "speed", "--runs", str(runs), "--out",
                                  str(tmp_path / "afile")])
    assert refused.exit_code == 1 and "is a file" in refused.stderr
    assert speed["mass"]["epochs"] == 2 and speed["mass"]["seconds_per_epoch"] > 0
    assert speed["mass"]["processes"] == 1  # recorded in run.json: 1 outside torchrun
    made = json.loads((runs / "mass" / "run.json").read_text())
    assert made["processes"] == 1 and [h["processes"] for h in made["history"]] == [1, 1]
    with pytest.raises(MasrError, match="nowhere: no such run folder"):  # a typo: said
        epoch_seconds([runs / "mass", tmp_path / "nowhere"])
    # two runs folders with a run of the same name: one row each, and a table on stderr
    log = _invoke(["analyze", "speed", "--runs", str(runs), "--runs", str(runs_dot), "--out",
                   str(out)])
    speed = json.loads((out / "speed.json").read_text())
    assert set(speed) == {"runs/mass", "runs-dot/mass"} and "s/epoch" in log
    assert "runs-dot/mass" in log
    # the same run twice under attention: analysed once, keyed by its label
    _invoke(["analyze", "attention", "--data", str(planted_dir), "--runs", str(runs / "mass"),
             "--runs", str(runs_dot / "mass"), "--runs", str(runs_dot / "mass"),
             "--out", str(out), "--cases", "0", "--bootstrap", "0"])
    table = json.loads((out / "attention.json").read_text())
    assert set(table) == {"mem-metric", "mem-dot"}
    assert "pearson_se" not in table["mem-metric"]
    # a runs directory stands for its MASS runs (an MDR run beside them is left out)
    _invoke(["train", "--model", "mdr", "--runs", str(runs_dot), *common])
    _invoke(["analyze", "attention", "--data", str(planted_dir), "--runs", str(runs),
             "--runs", str(runs_dot), "--out", str(out), "--cases", "0", "--bootstrap", "0"])
    by_folder = json.loads((out / "attention.json").read_text())
    assert set(by_folder) == {"mem-metric", "mem-dot"}
    assert by_folder["mem-metric"] == table["mem-metric"]
    assert by_folder["mem-dot"] == table["mem-dot"]
    refused = runner.invoke(app, ["analyze", "attention", "--data", str(planted_dir), "--runs",
                                  str(planted_dir), "--out", str(out)])
    assert refused.exit_code == 1 and "no MASS run in it" in refused.stderr


def test_analyze_writes_its_table_without_matplotlib(
    planted_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import masr.figures

    runs = tmp_path / "runs"
    _invoke(["train", "--model", "mass", "--runs", str(runs), "--data", str(planted_dir),
             "--epochs", "1", "--dim", "8", "--device", "cpu"])
    monkeypatch.setattr(masr.figures, "have_matplotlib", lambda: False)
    out = tmp_path / "analysis"
    out.mkdir()
    (out / "speed.png").write_bytes(b"an earlier run's figure")  # not left beside new tables
    for args in (["speed", "--runs", str(runs)],
                 ["attention", "--runs", str(runs / "mass"), "--data", str(planted_dir)]):
        log = _invoke(["analyze", *args, "--out", str(out)])
        assert "matplotlib is not installed" in log
    assert (out / "speed.json").is_file() and (out / "attention.json").is_file()
    assert not list(out.glob("*.png"))


def test_analyze_dims_keys_each_run_by_its_embedding_size(
    planted_dir: Path, tmp_path: Path
) -> None:
    common = ["--data", str(planted_dir), "--epochs", "1", "--device", "cpu"]
    for d in (8, 16):
        _invoke(["train", "--model", "mdr", "--dim", str(d), "--runs", str(tmp_path / f"d{d}"),
                 *common])
    _invoke(["train", "--model", "pop", "--runs", str(tmp_path / "d8"), *common])
    out = tmp_path / "analysis"
    args = ["analyze", "dims", "--data", str(planted_dir), "--out", str(out),
            "--full-sample", "40", "--device", "cpu"]
    log = _invoke([*args, "--runs", str(tmp_path / "d16"), "--runs", str(tmp_path / "d8"),
                   "--threads", "1"])
    table = json.loads((out / "dims.json").read_text())
    assert list(table) == ["mdr"] and list(table["mdr"]) == ["8", "16"]  # pop has no d
    assert "pop: no embedding size" in " ".join(log.split())  # rich wraps long lines
    refused = runner.invoke(app, [*args, "--runs", str(tmp_path / "d8"), "--threads", "-1"])
    assert refused.exit_code == 1 and "--threads must be >= 0" in refused.stderr
    # the same figures as `masr evaluate` gives the d = 16 run on the same cases
    _invoke(["evaluate", "--data", str(planted_dir), "--runs", str(tmp_path / "d16"),
             "--model", "mdr", "--full-sample", "40", "--device", "cpu",
             "--json", str(tmp_path / "eval.json")])
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert table["mdr"]["16"] == evaluated["mdr"]
    assert (out / "dims.png").stat().st_size > 0
    # a run directory works as an entry; the same run at the same d twice is one clear error
    _invoke([*args, "--runs", str(tmp_path / "d8" / "mdr"), "--model", "mdr"])
    assert list(json.loads((out / "dims.json").read_text())["mdr"]) == ["8"]
    twice = runner.invoke(app, [*args, "--runs", str(tmp_path / "d8"),
                                "--runs", str(tmp_path / "d8" / "mdr")])
    assert twice.exit_code == 1 and "d=8 is in two --runs entries" in " ".join(twice.stderr.split())
    assert "Traceback" not in twice.stderr
    typo = runner.invoke(app, [*args, "--runs", str(tmp_path / "d8"), "--model", "mdrr"])
    assert typo.exit_code == 1 and "--model mdrr: no such trained run" in typo.stderr
    assert embedding_size({"model_config": {"mdr": {"dim": 32}, "mass": {"dim": 32}}}) == 32
    assert embedding_size({"model_config": {"mdr": {"dim": 32}, "mass": {"dim": 64}}}) is None


def test_reproduce_end_to_end_then_reuses_every_run(
    planted_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "results"
    args = ["reproduce", "--data", str(planted_dir), "--out", str(out), "--time-limit", "5",
            "--epochs", "1", "--adv-epochs", "1", "--patience", "2", "--dims", "8,64",
            "--no-baselines",
            "--device", "cpu", "--attention-cases", "0"]
    _invoke(args)
    for name in ("table2", "table3", "table4", "apr_noise", "fig5_dims", "fig6_attention",
                 "fig7_speed"):
        assert (out / f"{name}.json").is_file(), name
    for name in ("fig4_hits", "fig5_dims", "fig6_attention", "fig7_speed"):
        assert (out / f"{name}.png").stat().st_size > 0, name
    table3 = json.loads((out / "table3.json").read_text())
    assert list(table3) == ["mdr_us", "mdr_ps", "mdr", "mass", "mass_ps", "mass_ups"]
    assert set(json.loads((out / "table4.json").read_text())) == {
        "nonmem-dot", "nonmem-metric", "mem-dot", "mem-metric", "none"
    }
    assert set(json.loads((out / "apr_noise.json").read_text())) == {
        "flexible eps=1.0", "flexible eps=0.5", "fixed eps=0.5", "fixed eps=1.0"
    }
    dims = json.loads((out / "fig5_dims.json").read_text())
    assert set(dims) == {"mdr", "mass", "masr"} and set(dims["mdr"]) == {"8", "64"}
    speed = json.loads((out / "fig7_speed.json").read_text())
    assert {"mdr", "mass", "amdr", "amass", "mdr_us", "mass_ps"} <= set(speed)
    report = (out / "report.md").read_text()
    assert "## Table 3" in report and "MASS_ups" in report and "## Figure 7" in report
    for name in ("fig4_hits", "fig5_dims", "fig6_attention", "fig7_speed"):  # shown in place
        assert f"]({name}.png)" in report, name
    assert "## Figure 4" in report
    # the paper's orderings case by case (no baselines trained: no "best baseline" rows)
    paired = json.loads((out / "paired.json").read_text())
    pairs = {(e["run"], e["against"], e["protocol"]) for e in paired}
    assert ("amdr", "mdr", "sampled") in pairs and ("amasr", "masr", "full") in pairs
    assert all(e["why"] != "best baseline" for e in paired)
    assert "Paired on the same test cases" in report and "| sampled | AMDR | MDR |" in report
    assert "5 s per run" in report and "patience 2" in report
    run = json.loads((out / "runs" / "main" / "mdr" / "run.json").read_text())
    assert run["train_config"]["patience"] == 2  # --patience reaches every run
    # a second reproduce reuses every run: nothing is trained again
    second = _invoke(args)
    assert "trained" not in second and "reused" in second
    # a run this reproduce does not make (an earlier one's baseline): left out, and said
    _invoke(["train", "--model", "pop", "--data", str(planted_dir), "--runs",
             str(out / "runs" / "main")])
    third = _invoke(args)
    assert "left out of the tables: pop" in third
    assert "pop" not in json.loads((out / "table2.json").read_text())
    assert "pop" not in json.loads((out / "fig7_speed.json").read_text())
    # a part removed, one cut short, one trained again since: each is made again with what
    # was made from it, never reused as it is (QA: a KeyError, a checkpoint error on every
    # rerun, AMDR of an earlier MDR beside the new MDR in Table 2)
    main = out / "runs" / "main"
    shutil.rmtree(main / "mdr_us")
    best = main / "mass_ps" / "best.pt"
    best.write_bytes(best.read_bytes()[:1000])
    info = json.loads((main / "mdr" / "run.json").read_text())
    info["best"]["valid"]["hit@10"] += 0.01  # as an MDR trained again to other figures
    (main / "mdr" / "run.json").write_text(json.dumps(info))
    fourth = _invoke(args)
    assert "mass_ps: " in fourth and "is damaged (cut short); making it again" in fourth
    assert "amdr: made from an earlier mdr (trained again since)" in fourth
    assert "masr: made from an earlier mdr" in fourth
    assert "main/mdr_us: trained" in fourth and "main/mass_ps: trained" in fourth
    assert set(json.loads((out / "table3.json").read_text())) >= {"mdr_us", "mass_ps"}
    # without matplotlib: the tables, no PNGs (an earlier run's are not shown beside them)
    import masr.figures

    monkeypatch.setattr(masr.figures, "have_matplotlib", lambda: False)
    fifth = _invoke(args)
    assert "no PNG: matplotlib is not installed" in fifth
    assert not list(out.glob("*.png")) and ".png)" not in (out / "report.md").read_text()


def test_reproduce_budget_options() -> None:
    from masr.config import ReproduceConfig
    from masr.errors import MasrError

    assert ReproduceConfig(time_limit=0, patience=0).time_limit == 0  # no limit, no early stop
    with pytest.raises(MasrError, match="--patience"):
        ReproduceConfig(patience=-1)
    with pytest.raises(MasrError, match="--time-limit"):
        ReproduceConfig(time_limit=-1)
    from masr.config import TrainConfig

    for bad in (math.inf, math.nan):  # inf was written to run.json as Infinity (not JSON)
        with pytest.raises(MasrError, match="--time-limit must be a finite number of seconds"):
            ReproduceConfig(time_limit=bad)
        with pytest.raises(MasrError, match="--time-limit must be a finite number of seconds"):
            TrainConfig(time_limit=bad)
    with pytest.raises(MasrError, match=r"--dims must be sizes in \[1, 65,536\]"):
        ReproduceConfig(dims=(8, 65537))  # before any training, as masr train --dim
    result = runner.invoke(app, ["reproduce", "--patience", "-1"])
    assert result.exit_code != 0 and "--patience" in result.output + result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_reproduce_trains_the_baselines_both_ways_and_keeps_the_better_on_validation(
    planted_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    import masr.reproduce as rep
    from masr.config import ReproduceConfig
    from masr.report import evaluate_runs, to_jsonable

    # two baselines keep the test short: one with an --entity (default playlist), one without
    monkeypatch.setattr(rep, "PAPER_BASELINES", (("mfbpr", "MF-BPR"),))
    monkeypatch.setattr(rep, "EXTRA_BASELINES", (("pop", "Popularity"),))
    out = tmp_path / "results"
    config = ReproduceConfig(time_limit=5, epochs=2, adv_epochs=1, patience=2, dims=(64,),
                             device="cpu", attention_cases=0)
    rep.reproduce(planted_dir, out, config)
    entities = json.loads((out / "entities.json").read_text())
    assert set(entities) == {"mfbpr"}  # pop has no entity
    figures = entities["mfbpr"]["valid hit@10"]
    runs = {"playlist": out / "runs" / "main", "user": out / "runs" / "entity-user"}
    for entity, runs_dir in runs.items():
        info = json.loads((runs_dir / "mfbpr" / "run.json").read_text())
        assert info["model_config"]["entity"] == entity
        assert figures[entity] == pytest.approx(info["best"]["valid"]["hit@10"])
    chosen = entities["mfbpr"]["chosen"]
    assert chosen == max(figures, key=lambda e: (figures[e], e == "playlist"))
    # Table 2's row is the chosen run's test evaluation
    data = load_prepared(planted_dir)
    expected = to_jsonable(evaluate_runs(data, runs[chosen], ["mfbpr"], device="cpu"))["mfbpr"]
    table2 = json.loads((out / "table2.json").read_text())
    assert table2["mfbpr"]["sampled"]["hit@10"] == pytest.approx(
        expected["sampled"]["hit@10"]
    )
    report = (out / "report.md").read_text()
    assert f"| MF-BPR ({chosen}) |" in report and "| Popularity |" in report
    # masr's models against the better baseline of each protocol, on Table 2's figures
    for e in json.loads((out / "paired.json").read_text()):
        a, b = table2[e["run"]][e["protocol"]], table2[e["against"]][e["protocol"]]
        assert e["hit@10"]["delta"] == pytest.approx(a["hit@10"] - b["hit@10"], abs=2e-6)
        if e["why"] == "best baseline":
            assert e["against"] == max(
                ("mfbpr", "pop"),
                key=lambda r: (table2[r][e["protocol"]]["hit@10"],
                               table2[r][e["protocol"]]["ndcg@10"]),
            )
    # --entities default (every run reused here): each baseline at its default entity only
    rep.reproduce(planted_dir, out, replace(config, entities="default"))
    assert json.loads((out / "entities.json").read_text()) == {}
    main = to_jsonable(evaluate_runs(data, runs["playlist"], ["mfbpr"], device="cpu"))["mfbpr"]
    assert json.loads((out / "table2.json").read_text())["mfbpr"] == main


def test_an_interrupted_reproduce_says_how_to_go_on(
    planted_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    import masr.runs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(masr.runs, "train_run", interrupted)
    result = runner.invoke(app, ["reproduce", "--data", str(planted_dir), "--out",
                                 str(tmp_path / "results"), "--device", "cpu"])
    assert result.exit_code == 130
    assert "the same `masr reproduce` command continues it" in result.stderr
    # interrupted outside training (the test evaluation): the same line (QA: none was said)
    import masr.reproduce

    monkeypatch.setattr(masr.runs, "train_run", lambda *args, **kwargs: [])
    monkeypatch.setattr(masr.reproduce, "_evaluate", interrupted)
    result = runner.invoke(app, ["reproduce", "--data", str(planted_dir), "--out",
                                 str(tmp_path / "results"), "--device", "cpu"])
    assert result.exit_code == 130 and "test evaluation" in result.stderr
    assert "the same `masr reproduce` command continues it" in result.stderr


def test_a_run_interrupted_inside_reproduce_names_reproduce(
    planted_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """The run's own line says what continues it: inside `masr reproduce` that is the same
    reproduce command, not `masr train --resume`."""
    import masr.train

    holders = []

    def saved_then_interrupted(*args, run_dir=None, **kwargs):
        holders.append(json.loads((Path(run_dir) / ".lock").read_text())["command"])
        (Path(run_dir) / "last.pt").write_bytes(b"an epoch")  # as after a finished epoch
        raise KeyboardInterrupt

    monkeypatch.setattr(masr.train, "train_model", saved_then_interrupted)
    result = runner.invoke(app, ["reproduce", "--data", str(planted_dir), "--out",
                                 str(tmp_path / "results"), "--device", "cpu"])
    assert result.exit_code == 130
    run_lines = [line for line in result.stderr.splitlines() if "interrupted after" in line]
    assert run_lines and run_lines[0].endswith("the same `masr reproduce` command continues it")
    assert "masr train ... --resume" not in result.stderr
    assert holders == ["masr reproduce"]  # a second reproduce is told who holds the run


def test_a_run_interrupted_in_its_first_epoch_inside_reproduce_names_reproduce(
    planted_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Nothing saved yet: the run starts again with the same reproduce command (it said
    `masr train` before), and the next reproduce does not offer a --resume it has not."""
    import masr.train

    real = masr.train.train_model
    calls = []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(masr.train, "train_model", interrupted_once)
    out = str(tmp_path / "results")
    args = ["reproduce", "--data", str(planted_dir), "--out", out, "--device", "cpu",
            "--epochs", "1", "--adv-epochs", "1", "--no-baselines", "--dims", "8",
            "--attention-cases", "0", "--time-limit", "2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 130
    assert ("mdr: interrupted in its first epoch (nothing saved to resume from); the same "
            "`masr reproduce` command starts it again") in first.stderr
    assert "masr train" not in first.stderr
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.stderr
    assert "--resume" not in second.stderr


def test_reproduce_config_from_python_checks_kinds_and_sizes() -> None:
    """Built in Python (QA: dims="16" trained the sizes 1 and 6, dims=(8.7,) the size 8,
    epochs="3" was a TypeError, seed=1.5 passed)."""
    from masr.config import ReproduceConfig
    from masr.errors import MasrError
    from masr.reproduce import reproduce

    for kwargs, message in (
        ({"dims": "16"}, "--dims '16': expected sizes like (8, 16, 32, 64)"),
        ({"dims": (8.7,)}, "--dims (8.7,): 8.7 is not an integer"),
        ({"dims": (8, 8)}, "--dims (8, 8): a size is given twice"),
        ({"epochs": "3"}, "--epochs '3': is not an integer"),
        ({"seed": 1.5}, "--seed 1.5: is not an integer"),
    ):
        with pytest.raises(MasrError, match=f"^{re.escape(message)}"):
            ReproduceConfig(**kwargs)
    assert ReproduceConfig(dims=[16, 8]).dims == (16, 8) and ReproduceConfig(dims=32).dims == (32,)
    with pytest.raises(MasrError, match=r"^reproduce\(config=...\): expected ReproduceConfig"):
        reproduce("data", "out", {"epochs": 1})  # type: ignore[arg-type]


def test_reproduce_without_test_cases_stops_before_training(tmp_path: Path) -> None:
    """QA: on prepared data with no test case (two playlists of the same five songs),
    reproduce trained every Table 2/3 run, then stopped at their test evaluation; it now
    says so first, and trains nothing."""
    csv = tmp_path / "two.csv"
    csv.write_text("user_id,playlist_id,track_id\n" + "".join(
        f"u{p},p{p},t{s}\n" for p in (1, 2) for s in range(5)))
    _invoke(["prep", str(csv), "--out", str(tmp_path / "data")])
    assert len(load_prepared(tmp_path / "data").test) == 0
    out = tmp_path / "results"
    refused = runner.invoke(app, ["reproduce", "--data", str(tmp_path / "data"), "--out",
                                  str(out), "--no-baselines", "--threads", "1"])
    assert refused.exit_code == 1
    assert "no test cases to rank" in refused.stderr, refused.stderr
    assert not (out / "runs").exists()


def test_epoch_seconds_follows_the_latest_process_count(tmp_path):
    """A run resumed under torchrun with another process count: its epoch time is that of the
    epochs trained with the latest count, which it reports, and the others are said (each
    epoch records its processes; before, run.json's one count was the resumed run's)."""
    run = tmp_path / "mass"
    run.mkdir()
    history = [{"epoch": 1, "train_seconds": 10.0},  # written before epochs recorded it
               {"epoch": 2, "train_seconds": 4.0, "processes": 2},
               {"epoch": 3, "train_seconds": 6.0, "processes": 2}]
    info = {"run": "mass", "model": "mass", "status": "finished", "processes": 1,
            "history": history}
    (run / "run.json").write_text(json.dumps(info))
    said: list[str] = []
    speed = epoch_seconds([run], log=said.append)
    assert speed["mass"]["processes"] == 2 and speed["mass"]["epochs"] == 2
    assert speed["mass"]["seconds_per_epoch"] == pytest.approx(5.0)
    assert len(said) == 1 and "1 of its epochs trained with another process count" in said[0]
    assert said[0].endswith("is the mean of the 2 trained with 2 processes")
    for h in history:  # one count throughout: every epoch, nothing said
        h["processes"] = 1
    (run / "run.json").write_text(json.dumps(info))
    said.clear()
    speed = epoch_seconds([run], log=said.append)
    assert speed["mass"]["epochs"] == 3 and said == []
    history[0]["processes"] = 0  # not a count: the run is left out with a warning
    (run / "run.json").write_text(json.dumps(info))
    assert epoch_seconds([run], log=said.append) == {} and "processes" in said[0]
