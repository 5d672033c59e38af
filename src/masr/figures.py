"""The PNGs of the paper's analyses (Figures 5-7): matplotlib is the optional extra
``masr[plot]``, imported inside each function; every PNG is written aside, then renamed.

* ``plot_dims``: quality against the embedding size d (Figure 5);
* ``plot_attention``: PMI attentive scores against learned attention weights (Figure 6);
* ``plot_epoch_seconds``: seconds per training epoch of every model (Figure 7).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from masr.errors import MasrError

#: what a command says when it writes its tables without their PNGs
NO_MATPLOTLIB = "no PNG: matplotlib is not installed (pip install 'masr[plot]')"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot(needed_by: str = "the plots") -> Any:
    """matplotlib.pyplot on the Agg backend, or one MasrError naming the optional extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MasrError(
            f"{needed_by} need{'s' if needed_by.startswith('--') else ''} matplotlib; "
            "install it with `pip install 'masr[plot]'`"
        ) from None
    return plt


def save_png(
    fig: Any, path: Path, *, dpi: int = 110, option: str = "", layout: bool = True
) -> Path:
    """Write ``fig`` as a PNG aside, then rename it into ``path``; close it either way. A
    write error is one MasrError line (prefixed by ``option`` when a CLI option named it).
    ``layout``: tighten the layout first (False: the caller laid it out, e.g. around a
    legend beside the axes)."""
    from masr.atomic import atomic_path

    plt = pyplot()
    if layout:
        fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    except OSError as exc:
        where = f"{option} {path}" if option else str(path)
        raise MasrError(f"{where}: cannot write ({exc.strerror})") from None
    finally:
        plt.close(fig)
    return path


def plot_dims(
    table: dict[str, dict[str, dict[str, dict[str, float]]]], path: str | Path
) -> Path:
    """Figure 5: ``table`` {run: {d: {protocol: metrics}}} as hit@10 and ndcg@10 against d,
    one row of panels per protocol (sampled, then full), so that each keeps its own scale (a
    full-ranking hit@10 is often a tenth of the sampled one); a run has one colour throughout."""
    plt = pyplot()
    metrics = ("hit@10", "ndcg@10")
    protocols = sorted({p for by_dim in table.values() for res in by_dim.values() for p in res},
                       key=lambda p: (p != "sampled", p))
    fig, axes = plt.subplots(max(1, len(protocols)), 2, figsize=(10, 3.6 * max(1, len(protocols))),
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, protocol in zip(axes, protocols, strict=False):
        for ax, metric in zip(row, metrics, strict=True):
            for i, (run, by_dim) in enumerate(table.items()):
                dims = sorted((d for d in by_dim if protocol in by_dim[d]), key=int)
                ax.plot([int(d) for d in dims], [by_dim[d][protocol][metric] for d in dims],
                        marker="o", label=run, color=colours[i % len(colours)])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("embedding size d")
            ax.set_ylabel(f"{metric} ({protocol})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return save_png(fig, Path(path))


def plot_attention(
    panels: dict[str, tuple[list[float], list[float], float, float]], path: str | Path
) -> Path:
    """Figure 6: one scatter per attention variant,
    {label: (pmi_scores, weights, rho, rho_within_cases)}."""
    plt = pyplot()
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.6), squeeze=False)
    for ax, (label, (pmi, weights, rho, within)) in zip(axes[0], panels.items(), strict=False):
        ax.scatter(pmi, weights, s=4, alpha=0.4)
        inside = "undefined" if within != within else f"{within:.3f}"  # NaN: equal weights
        ax.set_title(f"{label}\nρ = {rho:.3f}, within cases {inside}", fontsize=9)
        ax.set_xlabel("PMI attentive score")
        ax.set_ylabel("attention weight")
        ax.grid(alpha=0.3)
    return save_png(fig, Path(path))


def plot_epoch_seconds(seconds: dict[str, float], path: str | Path) -> Path:
    """Figure 7: seconds per training epoch, one bar per model."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(seconds) + 2), 4))
    names = list(seconds)
    ax.bar(names, [seconds[n] for n in names])
    ax.set_ylabel("seconds per epoch")
    ax.tick_params(axis="x", rotation=60)
    ax.grid(alpha=0.3, axis="y")
    return save_png(fig, Path(path))


def maybe(plot: Callable[[Any, str | Path], Path], data: Any, path: str | Path) -> Path | None:
    """``plot(data, path)``; without matplotlib None, and an earlier run's PNG at ``path`` is
    removed, so that it is not read beside the new table (the tables are written regardless)."""
    if have_matplotlib():
        return plot(data, path)
    Path(path).unlink(missing_ok=True)
    return None
