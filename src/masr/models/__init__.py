"""Model registry: name -> class, imported lazily so that listing names never imports torch."""

from __future__ import annotations

import math
from importlib import import_module
from typing import TYPE_CHECKING

from masr.errors import MasrError

if TYPE_CHECKING:
    from masr.models.base import Recommender

# The paper's models. The adversarial variants (amdr, amass, amasr) are the same classes
# trained with APR; `masr.runs` maps run names to classes and training procedures.
PAPER_MODELS = {
    "mdr": "masr.models.mdr:MDR",
    "mass": "masr.models.mass:MASS",
    "masr": "masr.models.masr:MASR",
}
# Baselines (issue 5).
BASELINES = {
    "pop": "masr.models.pop:Popularity",
    "itemknn": "masr.models.itemknn:ItemKNN",
    "ease": "masr.models.ease:EASE",
    "mfbpr": "masr.models.mfbpr:MFBPR",
    "cml": "masr.models.cml:CML",
    "fism": "masr.models.fism:FISM",
    "als": "masr.models.als:ALS",
    # the paper's other baselines (issue 12)
    "neumf": "masr.models.neumf:NeuMF",
    "cmn": "masr.models.cmn:CMN",
    "prme": "masr.models.prme:PRME",
    "transrec": "masr.models.transrec:TransRec",
    "caser": "masr.models.caser:Caser",
}
REGISTRY = {**PAPER_MODELS, **BASELINES}


def model_class(name: str) -> type[Recommender]:
    """The class registered under ``name`` (``mdr``, ``mass``, ``itemknn`` ...)."""
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(import_module(module), attr)


def parse_settings(names: list[str], items: list[str]) -> dict[str, object]:
    """``["shrink=10", "alpha=0.75"]`` -> ``{"shrink": 10.0, "alpha": 0.75}``, typed by the config
    fields of the registered models ``names``; a MasrError names the first bad ``--set`` item.
    ``MODEL.NAME=VALUE`` (MODEL one of ``names``) is kept as ``{"MODEL.NAME": value}``: it sets
    NAME for that model's runs only, over an unscoped NAME (``masr.runs.model_config``)."""
    from dataclasses import MISSING, fields

    known: dict[str, object] = {}
    owned: dict[str, tuple[str, str]] = {}  # field -> (owning option, model)
    aliases: dict[str, str] = {}  # another accepted name -> field (Caser's L -> window)
    for name in names:
        config_class = model_class(name).config_class
        aliases.update(config_class.setting_aliases)
        for field_name, option in config_class.owned_fields.items():
            owned.setdefault(field_name, (option, name))
        for f in fields(config_class):
            if f.name not in known and f.name not in config_class.owned_fields:
                known[f.name] = f.default if f.default is not MISSING else None
                known[f.name + ":type"] = str(f.type)
    settable = sorted(k for k in known if ":" not in k)
    out: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        key = aliases.get(key, key)
        scope, dot, field_name = key.partition(".")
        if dot:  # MODEL.NAME=VALUE: for the runs of that model only (e.g. mdr.dropout=0.7)
            if scope not in names:
                raise MasrError(
                    f"--set {item}: {scope!r} is not a model this command trains "
                    f"({', '.join(dict.fromkeys(names))})"
                )
            inner = f"{field_name}={text}"
            try:
                scoped = parse_settings([scope], [inner])
            except MasrError as err:  # name the item as the user wrote it
                raise MasrError(str(err).replace(f"--set {inner}", f"--set {item}", 1)) from None
            ((field_name, value),) = scoped.items()  # the field's own name (aliases resolved)
            out[f"{scope}.{field_name}"] = value
            continue
        if key in owned and owned[key][0] and key not in settable:
            option, model = owned[key]
            raise MasrError(
                f"--set {item}: {model}'s {key} has its own option; use {option} {text.strip()}"
            )
        if not sep or key not in settable:
            raise MasrError(
                f"--set {item}: expected NAME=VALUE with NAME one of "
                f"{', '.join(settable) or '(none)'} for {'/'.join(names)}"
            )
        value = _parse_value(item, text.strip(), known[key], str(known[key + ":type"]))
        if key in out and out[key] != value:  # a repeated --set: which one was meant?
            raise MasrError(f"--set {key}: given twice ({out[key]} and {value}); give it once")
        out[key] = value
    return out


def _parse_value(item: str, text: str, default: object, annotation: str) -> object:
    if "None" in annotation and text.lower() == "none":
        return None
    try:
        if isinstance(default, bool) or annotation == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, int) or annotation.startswith("int"):
            return int(text)
        if isinstance(default, float) or annotation.startswith("float"):
            value = float(text)
            if not math.isfinite(value):  # nan/inf: a model of zeros or NaNs, never wanted
                raise MasrError(f"--set {item}: must be a finite number")
            return value
    except ValueError:
        if isinstance(default, bool):
            kind = "bool"
        elif default is None:  # "float | None": a float, or none for the model's own default
            kind = f"{annotation.split('|')[0].strip()} (or none)"
        else:
            kind = type(default).__name__
        raise MasrError(f"--set {item}: {text!r} is not a valid {kind}") from None
    return text
