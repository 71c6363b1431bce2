"""``seqbalance lengths``: token lengths of your own dataset file, offline, saved as .npy."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.cli._common import (
    add_json_flag,
    flag_names,
    print_json,
    print_table,
    progress,
    write_output,
)
from seqbalance.datasets.lengths import (
    FORMATS,
    TEMPLATES,
    Fields,
    TokenLengths,
    token_lengths,
)
from seqbalance.datasets.trl import (
    PACKING_STRATEGIES,
    TRL_MAX_LENGTH,
    TRL_SEED,
    TRUNCATION_MODES,
    trl_token_lengths,
)

_SHOWN_SKIPPED = 10

DESCRIPTION = """\
Count the tokens of every record of a JSON lines / JSON / Parquet file (optionally .gz) and save
the lengths (int64, one per sample) as a .npy file for `seqbalance simulate --lengths` and
`seqbalance plan`. Everything runs offline.

Text: repeat --text-field for prompt + response fields (the last one is the response turn, the
others form the prompt turn, joined with newlines: Alpaca's instruction/input/output); a response
field holding a list of strings gives one sample per response (a GRPO group; see --groups-output).
Or --chat-field for a list of messages ({role, content} or ShareGPT's {from, value}) or an HH-RLHF
"Human:/Assistant:" transcript; repeat it for a conversation split over fields (TRL's
conversational prompt + completion). Without either, common layouts are recognised from the first
record (OpenAI messages, ShareGPT, Alpaca, TRL prompt/completion plain or conversational, ...).

--tokenizer takes qwen, llama3, a tokenizer.json, or a local Hugging Face tokenizer directory;
with a directory whose tokenizer has a chat template, each sample is rendered with that template
and counted as rendered (--template auto); otherwise the chatml template adds 5 tokens per turn.

--trl counts exactly what TRL's trainers feed the model (tokenizer: the model's local Hugging Face
tokenizer directory; needs transformers): "text" + EOS, "messages" through the chat template,
prompt/completion (plain or conversational), truncated to --max-length (TRL's default 1024);
preference pairs (prompt/chosen/rejected) as DPOTrainer tokenizes them, two samples per record in
one group. Records TRL drops (no loss token left in the --max-length window) are listed and left
out. TRL's SFTConfig settings: --completion-only-loss, --assistant-only-loss, --packing
(bfd, bfd_split, wrapped: one length per packed row, --pieces-output for the sequences inside
them), --shuffle-dataset with --seed, --dataset-num-proc.

Malformed records are an error naming their line numbers (JSON lines) or record indices (JSON,
Parquet); --skip-malformed skips them and lists them.
"""

_TRL_ONLY = (
    ("max_length", "--max-length"),
    ("truncation_mode", "--truncation-mode"),
    ("completion_only_loss", "--completion-only-loss"),
    ("assistant_only_loss", "--assistant-only-loss"),
    ("packing", "--packing"),
    ("shuffle_dataset", "--shuffle-dataset"),
    ("seed", "--seed"),
    ("dataset_num_proc", "--dataset-num-proc"),
    ("pieces_output", "--pieces-output"),
)
_TRL_CONFLICTS = (
    ("text_field", "--text-field"),
    ("chat_field", "--chat-field"),
    ("history_field", "--history-field"),
    ("extra_field", "--extra-field"),
    ("drop_empty", "--drop-empty"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lengths",
        help="token lengths of your dataset file (offline tokenizers) -> .npy",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "file", type=Path, help="dataset file: .jsonl, .json or .parquet (maybe .gz)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="where to write the lengths (.npy, int64)"
    )
    parser.add_argument(
        "--format", choices=FORMATS, default=None, help="file format (default: from the extension)"
    )
    text = parser.add_mutually_exclusive_group()
    text.add_argument(
        "--text-field",
        action="append",
        default=None,
        metavar="FIELD",
        help="a text field; repeat for prompt fields then the response field",
    )
    text.add_argument(
        "--chat-field",
        action="append",
        default=None,
        metavar="FIELD",
        help="a field holding the conversation (list of messages); repeat for several, in order",
    )
    parser.add_argument(
        "--history-field",
        metavar="FIELD",
        help="earlier [prompt, response] pairs (LLaMA-Factory alpaca 'history'), with --text-field",
    )
    parser.add_argument(
        "--extra-field",
        action="append",
        default=None,
        metavar="FIELD",
        help="text counted without a turn of its own (e.g. a tool schema); may be repeated",
    )
    parser.add_argument(
        "--tokenizer",
        default="qwen",
        help="qwen (Qwen2/2.5/3), llama3, PATH/tokenizer.json, a local HF tokenizer directory, "
        "or hf:LOCAL_DIR (through transformers) (default: qwen)",
    )
    parser.add_argument(
        "--template",
        choices=TEMPLATES,
        default="auto",
        help="auto = the tokenizer's own chat template when it has one, else chatml; "
        "tokenizer = insist on it; chatml = 5 tokens per turn; none = text only",
    )
    parser.add_argument(
        "--groups-output",
        type=Path,
        metavar="PATH",
        help="also write the group id of each sample (.npy) when responses come in lists",
    )
    parser.add_argument(
        "--skip-malformed",
        action="store_true",
        help="skip malformed records (listed on stderr) instead of failing",
    )
    parser.add_argument(
        "--drop-empty",
        action="store_true",
        help="leave out records without any text (default: keep them, aligned with the file)",
    )
    trl = parser.add_argument_group("TRL (--trl)")
    trl.add_argument(
        "--trl",
        action="store_true",
        help="count as TRL's SFTTrainer (DPOTrainer for preference pairs) tokenizes and truncates",
    )
    trl.add_argument(
        "--max-length",
        type=_max_length,
        default=None,
        metavar="N|none",
        help=f"TRL's max_length: lengths are cut to it (default: {TRL_MAX_LENGTH}, TRL's)",
    )
    trl.add_argument(
        "--truncation-mode",
        choices=TRUNCATION_MODES,
        default=None,
        help="TRL's truncation_mode (decides which records are dropped; default keep_start)",
    )
    trl.add_argument(
        "--completion-only-loss",
        choices=("true", "false"),
        default=None,
        help="SFTConfig's completion_only_loss (default: true for prompt/completion data)",
    )
    trl.add_argument(
        "--assistant-only-loss",
        action="store_true",
        default=None,
        help="SFTConfig's assistant_only_loss: loss on the assistant turns only (conversations)",
    )
    trl.add_argument(
        "--packing",
        choices=PACKING_STRATEGIES,
        default=None,
        help="SFTConfig(packing=True, packing_strategy=...): one length per packed row",
    )
    trl.add_argument(
        "--pieces-output",
        type=Path,
        metavar="PATH",
        help="with --packing: write the sequences inside the rows (.npy, row after row)",
    )
    trl.add_argument(
        "--shuffle-dataset",
        action="store_true",
        default=None,
        help="SFTConfig's shuffle_dataset: the trainer's order, shuffled with --seed",
    )
    trl.add_argument(
        "--seed", type=_positive_or_zero, default=None, help=f"TRL's seed (default {TRL_SEED})"
    )
    trl.add_argument(
        "--dataset-num-proc",
        type=_positive,
        default=None,
        metavar="N",
        help="SFTConfig's dataset_num_proc (packing runs per worker shard)",
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def _max_length(text: str) -> int | str:
    if text.lower() == "none":
        return "none"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'none', got {text!r}")
    return value


def _positive(text: str) -> int:
    return _at_least(text, 1, "a positive integer")


def _positive_or_zero(text: str) -> int:
    return _at_least(text, 0, "a non-negative integer")


def _at_least(text: str, minimum: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:  # one message for every bad value (-3 is no more "non-negative" than 0)
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}")
    return value


def _trl_max_length(given: int | str | None) -> int | None:
    """``--max-length``: TRL's default when not given, no cut for ``none``."""
    if given is None:
        return TRL_MAX_LENGTH
    return None if given == "none" else int(given)


def _fields(args: argparse.Namespace) -> Fields | None:
    extra = tuple(args.extra_field or ())
    if args.text_field:
        return Fields(text=tuple(args.text_field), history=args.history_field, extra=extra)
    if args.chat_field:
        if args.history_field:
            raise ValueError("--history-field goes with --text-field, not with --chat-field")
        return Fields(chat=tuple(args.chat_field), extra=extra)
    if args.history_field or extra:
        raise ValueError("--history-field and --extra-field need --text-field or --chat-field")
    return None


def _listed(locations: np.ndarray) -> str:
    """The first ``_SHOWN_SKIPPED`` record locations, comma-separated (`` ...`` when more)."""
    shown = ", ".join(map(str, locations[:_SHOWN_SKIPPED].tolist()))
    return shown + (" ..." if locations.size > _SHOWN_SKIPPED else "")


def _report_skipped(result: TokenLengths) -> None:
    kind = result.location_kind
    if result.malformed:
        print(f"skipped {len(result.malformed)} malformed record(s):", file=sys.stderr)
        for record in result.malformed[:_SHOWN_SKIPPED]:
            print(f"  {kind} {record.location}: {record.reason}", file=sys.stderr)
        if len(result.malformed) > _SHOWN_SKIPPED:
            print(f"  ... and {len(result.malformed) - _SHOWN_SKIPPED} more", file=sys.stderr)
    if result.empty.size:
        action = (
            "left out" if result.dropped_empty else "kept (pass --drop-empty to leave them out)"
        )
        print(
            f"{result.empty.size} record(s) without text, {action}: "
            f"{kind}s {_listed(result.empty)}",
            file=sys.stderr,
        )
    if result.dropped.size:
        print(
            f"{result.dropped.size} record(s) left out, as the trainer drops them (no loss token "
            f"left after truncation): {kind}s {_listed(result.dropped)}",
            file=sys.stderr,
        )


def _check_trl_flags(args: argparse.Namespace) -> None:
    """TRL's settings only with --trl, and --trl without the field and template flags."""
    if not args.trl:
        given = [flag for name, flag in _TRL_ONLY if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: TRL settings, they go with --trl")
    if args.pieces_output is not None and args.packing is None:
        raise ValueError("--pieces-output goes with --packing (the sequences inside packed rows)")
    if args.trl:
        given = [flag for name, flag in _TRL_CONFLICTS if getattr(args, name)]
        if args.template != "auto":
            given.append("--template")
        if given:
            raise ValueError(
                f"--trl reads the fields TRL reads and renders with the tokenizer's template; "
                f"drop {', '.join(given)}"
            )


def _count(args: argparse.Namespace, show: Any) -> TokenLengths:
    """The lengths as the flags ask: TRL's (--trl) or ours."""
    if not args.trl:
        return token_lengths(
            args.file,
            fields=_fields(args),
            format=args.format,
            tokenizer=args.tokenizer,
            template=args.template,
            skip_malformed=args.skip_malformed,
            drop_empty=args.drop_empty,
            progress=show,
        )
    completion_only = args.completion_only_loss
    return trl_token_lengths(
        args.file,
        tokenizer=args.tokenizer,
        format=args.format,
        max_length=_trl_max_length(args.max_length),
        truncation_mode=args.truncation_mode or "keep_start",
        completion_only_loss=None if completion_only is None else completion_only == "true",
        assistant_only_loss=bool(args.assistant_only_loss),
        packing=args.packing is not None,
        packing_strategy=args.packing or "bfd",
        shuffle_dataset=bool(args.shuffle_dataset),
        seed=TRL_SEED if args.seed is None else args.seed,
        dataset_num_proc=args.dataset_num_proc,
        skip_malformed=args.skip_malformed,
        progress=show,
    )


def run(args: argparse.Namespace) -> int:
    # numpy.save appends .npy to any other name: "--groups-output x" wrote x.npy, which was the
    # lengths file of "-o x.npy" (overwritten by the group ids without a word) or any other file.
    for flag, path in (
        ("--output", args.output),
        ("--groups-output", args.groups_output),
        ("--pieces-output", args.pieces_output),
    ):
        if path is not None and path.suffix != ".npy":
            raise ValueError(f"{flag} must be a .npy file, got {str(path)!r}")
    started = time.perf_counter()
    show = lambda items, **options: progress(items, enabled=not args.json, **options)  # noqa: E731
    _check_trl_flags(args)
    try:
        result = _count(args, show)
    except ValueError as error:
        flags = {"skip_malformed": "--skip-malformed", **dict(_TRL_ONLY)}
        raise ValueError(flag_names(str(error), flags)) from None
    if args.groups_output is not None and result.groups is None:
        raise ValueError(
            "--groups-output: no field holds a list of responses, so there are no groups"
        )
    write_output(args.output, "-o/--output", lambda path: np.save(path, result.lengths))
    if args.groups_output is not None:
        write_output(
            args.groups_output, "--groups-output", lambda path: np.save(path, result.groups)
        )
    if args.pieces_output is not None:
        write_output(
            args.pieces_output, "--pieces-output", lambda path: np.save(path, result.pieces)
        )
    _report_skipped(result)

    summary = {
        "file": str(args.file),
        "output": str(args.output),
        "groups_output": None if args.groups_output is None else str(args.groups_output),
        **result.summary(),
        **({"max_length": _trl_max_length(args.max_length)} if args.trl else {}),
        **({"packing": args.packing} if args.packing else {}),
        "seconds": round(time.perf_counter() - started, 3),
    }
    if args.json:
        print_json(summary)
        return 0
    counted = ("samples", *(("pieces",) if result.pieces is not None else ()), "records")
    columns = [*counted, "tokens"]
    row = [f"{summary[key]:,}" for key in (*counted, "total_tokens")]
    if result.lengths.size:
        columns += ["mean", "median", "p90", "max"]
        row += [f"{summary[key]:,.0f}" for key in ("mean", "median", "p90", "max")]
    fields = "; ".join(
        f"{kind}: {', '.join(names) if isinstance(names, list) else names}"
        for kind, names in summary["fields"].items()
    )
    print_table(
        f"{args.file.name}: token lengths ({result.tokenizer} tokenizer, {result.template})",
        columns,
        [row],
        caption=f"fields {fields} -> {args.output}",
    )
    return 0
