"""The bundled length sets: integer token lengths of real datasets, stored as package data.

``data/manifest.json`` describes every set (source, license, tokenizer, how it was counted);
``data/<name>.npy`` holds its lengths and ``data/<name>.groups.npy`` its group ids when it has
groups. ``scripts/build_datasets.py`` writes them from the raw text with ``token_lengths``.
Loading needs numpy only.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_choice

__all__ = ["DATA_DIR", "MANIFEST", "describe", "groups", "info", "load", "names"]

DATA_DIR = Path(__file__).resolve().parent / "data"
MANIFEST = DATA_DIR / "manifest.json"


@functools.lru_cache(maxsize=1)
def _manifest() -> dict[str, dict[str, Any]]:
    with MANIFEST.open(encoding="utf-8") as handle:
        return json.load(handle)["datasets"]


def names() -> list[str]:
    """Names of the bundled length sets, sorted."""
    return sorted(_manifest())


def _entry(name: str) -> dict[str, Any]:
    return _manifest()[check_choice(name, "name", names())]


def load(name: str) -> np.ndarray:
    """Token lengths (int64, one per sample, in the dataset's order) of a bundled set."""
    entry = _entry(name)
    return np.load(DATA_DIR / entry["lengths_file"]).astype(np.int64)


def groups(name: str) -> np.ndarray | None:
    """Group id per sample (int64; e.g. the prompt of each GRPO response), None if ungrouped."""
    entry = _entry(name)
    if entry.get("groups_file") is None:
        return None
    return np.load(DATA_DIR / entry["groups_file"]).astype(np.int64)


def info(name: str) -> dict[str, Any]:
    """What a bundled set is: description, source, license, samples, tokenizer, template, ...

    Keys: ``name``, ``title``, ``description``, ``source``, ``license``, ``samples``,
    ``groups`` (number of groups or None), ``tokenizer``, ``template``, ``fields`` (how records
    were counted), ``empty_records_dropped``, ``raw_file`` and ``raw_sha256`` (the text it was
    derived from), ``reference_array`` and ``reference_median_relative_difference`` (the
    array in ../shared/data/lengths it was checked against, and the median of |ours - ref| / ref).
    """
    entry = _entry(name)
    return {
        "name": name,
        **{
            key: value
            for key, value in entry.items()
            if not key.endswith("_file") or key == "raw_file"
        },
    }


def describe(name: str) -> dict[str, Any]:
    """A bundled set at a glance (what ``seqbalance datasets`` lists).

    Args:
        name: One of :func:`names`.

    Returns:
        ``name``, ``title``, ``samples``, ``grouped``, ``groups`` (number of groups or None),
        the ``median``, ``p90`` and ``max`` sample length and ``total_tokens`` (tokens), and
        ``description``, ``source`` and ``license`` from :func:`info`.
    """
    lengths = load(name)
    group_ids = groups(name)
    about = info(name)
    return {
        "name": name,
        "title": about["title"],
        "samples": int(lengths.size),
        "grouped": group_ids is not None,
        "groups": None if group_ids is None else int(np.unique(group_ids).size),
        "median": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)),
        "max": int(lengths.max()),
        "total_tokens": int(lengths.sum()),
        "description": about["description"],
        "source": about["source"],
        "license": about["license"],
    }
