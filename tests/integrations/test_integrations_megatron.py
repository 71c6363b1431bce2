"""The Megatron iterator: packed THD micro-batches in PackedSeqParams' shape, a micro-batch count
per step and per-token loss, alone and under megatron-core's own schedules on gloo processes."""

from __future__ import annotations

import importlib.util
import itertools
from functools import partial
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqbalance.integrations.megatron import (  # noqa: E402
    IGNORE_INDEX,
    MegatronDataIterator,
    check_config,
    hybrid_cp_batch,
    hybrid_cp_groups,
    hybrid_cp_sizes,
    pack_thd,
    per_token_loss,
    step_loss,
)
from seqbalance.measure.launch import launch  # noqa: E402
from seqbalance.plan.context_parallel import ContextParallel  # noqa: E402


def test_pack_thd_fields_by_hand() -> None:
    batch = pack_thd([[1, 2, 3], [4, 5]], pad_multiple=2)
    assert batch["tokens"].tolist() == [[1, 2, 3, 0, 4, 5]]
    assert batch["labels"].tolist() == [[2, 3, IGNORE_INDEX, IGNORE_INDEX, 5, IGNORE_INDEX]]
    assert batch["loss_mask"].tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1]]
    params = batch["packed_seq_params"]
    assert params["qkv_format"] == "thd"
    assert params["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert params["cu_seqlens_q"].dtype == torch.int32
    assert params["cu_seqlens_kv"].tolist() == [0, 3, 5]
    assert params["cu_seqlens_q_padded"].tolist() == [0, 4, 6]
    assert params["cu_seqlens_kv_padded"].tolist() == [0, 4, 6]
    assert (params["max_seqlen_q"], params["max_seqlen_kv"], params["total_tokens"]) == (4, 4, 6)


def test_pack_thd_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="samples is empty"):
        pack_thd([])
    with pytest.raises(ValueError, match=r"samples\[1\]"):
        pack_thd([[1], []])
    with pytest.raises(ValueError, match="pad_multiple"):
        pack_thd([[1]], pad_multiple=0)


def iterators(
    dp: int, num_microbatches: int | None = 4, **options: object
) -> tuple[list[MegatronDataIterator], np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, 96)
    dataset = [np.arange(n) + i for i, n in enumerate(lengths)]
    made = [
        MegatronDataIterator(
            dataset,
            lengths,
            global_batch_size=16 * dp,
            dp_rank=r,
            dp_size=dp,
            num_microbatches=num_microbatches,
            pad_multiple=4,
            max_tokens=600,
            **options,
        )
        for r in range(dp)
    ]
    return made, lengths


def test_every_rank_gets_m_packed_microbatches_per_step_within_the_cap() -> None:
    ranks, lengths = iterators(2)
    assert ranks[0].num_steps() == ranks[1].num_steps() == 3  # 96 samples, 32 per step
    for _ in range(ranks[0].num_steps()):
        seen = []
        for it in ranks:
            for _ in range(4):
                batch = next(it)
                params = batch["packed_seq_params"]
                assert params["total_tokens"] <= 600
                assert batch["tokens"].shape == (1, params["total_tokens"])
                starts = params["cu_seqlens_q_padded"][:-1].tolist()
                sizes = (params["cu_seqlens_q"][1:] - params["cu_seqlens_q"][:-1]).tolist()
                seen.extend(
                    (int(batch["tokens"][0, s]), n) for s, n in zip(starts, sizes, strict=True)
                )
        # the first token of sample i is i: 32 distinct samples of the right lengths per step
        assert len({i for i, _ in seen}) == 32
        assert all(lengths[i] == n for i, n in seen)
    with pytest.raises(StopIteration):
        next(ranks[0])


def test_resume_continues_exactly() -> None:
    (first,), _ = iterators(1)
    for _ in range(5):
        next(first)
    state = first.state_dict()
    expected = [next(first)["tokens"] for _ in range(3)]
    (resumed,), _ = iterators(1)
    resumed.load_state_dict(state)
    for want in expected:
        assert torch.equal(next(resumed)["tokens"], want)


def test_set_epoch_of_the_current_epoch_keeps_a_loaded_resume_point() -> None:
    # A training loop calls set_epoch(epoch) at the top of every epoch, resumed or not.
    (first,), _ = iterators(1)
    steps = first.steps()
    list(next(steps))
    state = first.state_dict()
    expected = [step.indices for step in steps]
    (resumed,), _ = iterators(1)
    resumed.load_state_dict(state)
    resumed.set_epoch(resumed.sampler.epoch)
    assert [step.indices for step in resumed.steps()] == expected


def test_steps_yield_each_steps_count_then_stop() -> None:
    (it,), _ = iterators(1, num_microbatches=None)
    counts = it.microbatches_per_step()
    steps = list(it.steps())
    assert [step.num_microbatches for step in steps] == [len(step) for step in steps] == counts
    for step in steps:
        batches = list(step)  # exactly num_microbatches, then StopIteration
        assert len(batches) == step.num_microbatches
        assert [b["packed_seq_params"]["cu_seqlens_q"].numel() - 1 for b in batches] == [
            len(indices) for indices in step.indices
        ]
    assert sorted(i for step in steps for mb in step.indices for i in mb) == list(range(96))


def test_steps_refuse_a_position_inside_a_step_and_resume_at_a_boundary() -> None:
    (it,), _ = iterators(1)  # 6 steps of 4 micro-batches
    next(it)
    with pytest.raises(ValueError, match="inside a step"):
        next(it.steps())
    for _ in range(3):
        next(it)
    state = it.state_dict()
    (resumed,), _ = iterators(1)
    resumed.load_state_dict(state)
    (fresh,), _ = iterators(1)
    assert [step.indices for step in resumed.steps()] == [step.indices for step in fresh.steps()][
        1:
    ]


def test_megatron_position_and_config_checks() -> None:
    with pytest.raises(ValueError, match="dp_rank and dp_size, or neither"):
        MegatronDataIterator([[1]], [1], global_batch_size=1, dp_rank=0)

    class Config:
        calculate_per_token_loss = False
        pipeline_model_parallel_size = 2
        variable_seq_lengths = False

    with pytest.raises(ValueError, match="calculate_per_token_loss must be True"):
        check_config(Config())
    Config.calculate_per_token_loss = True
    with pytest.raises(ValueError, match="variable_seq_lengths must be True"):
        check_config(Config())
    Config.variable_seq_lengths = True
    check_config(Config())
    Config.hybrid_context_parallel = True
    with pytest.raises(ValueError, match="hybrid_context_parallel needs pipeline"):
        check_config(Config())


def test_per_token_loss_and_step_loss_by_hand() -> None:
    total, count, report = per_token_loss(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([1, 0, 1]))
    assert (float(total), int(count), report["lm loss"].tolist()) == (5.0, 2, [5.0, 2.0])
    with pytest.raises(ValueError, match="loss_mask has 2"):
        per_token_loss(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match="last pipeline stage"):
        step_loss([])


# --- megatron-core's own schedules on gloo processes ---------------------------------------------
#
# A tiny language model: embedding -> causal mean within each packed sequence (cu_seqlens) -> MLP
# through Megatron's ColumnParallelLinear / RowParallelLinear -> output layer -> per-token cross
# entropy. The reference runs each sample alone in one process, in plain torch, with the same
# weights: the Megatron runs must give the same loss and gradients whatever the packing.

needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None
    or importlib.util.find_spec("megatron.core") is None
    or importlib.util.find_spec("triton") is None,
    reason="megatron-core (and triton, which it imports) not installed: pip install --no-deps "
    "--ignore-requires-python megatron-core==0.19.2 triton==3.9.0 (README's test command)",
)
VOCAB, HIDDEN, FFN = 16, 8, 16
DP, STEP_SAMPLES, MAX_TOKENS = 2, 8, 32
# Two steps in dataset order (shuffle=False): short samples (1 micro-batch per rank), long ones.
STEP_LENGTHS = [[3, 4, 5, 6, 7, 8, 5, 4], [30, 25, 20, 15, 12, 10, 28, 22]]


def tiny_data() -> tuple[list[torch.Tensor], list[int]]:
    lengths = [n for step in STEP_LENGTHS for n in step]
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths], lengths


def tiny_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"emb": (VOCAB, HIDDEN), "up": (FFN, HIDDEN), "down": (HIDDEN, FFN)}
    shapes |= {"head_w": (VOCAB, HIDDEN), "head_b": (VOCAB,)}
    return {name: 0.5 * torch.randn(shape, generator=g) for name, shape in shapes.items()}


def causal_mean(h: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """Each token's mean over its own sequence's tokens so far: attention within a sequence."""
    pieces = [
        torch.cumsum(h[a:b], 0) / torch.arange(1, b - a + 1).unsqueeze(1)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(pieces)


def logits_of(h: torch.Tensor, up: Any, down: Any, w: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.linear(
        h + down(torch.nn.functional.gelu(up(h))), w["head_w"], w["head_b"]
    )


def reference(samples: list[int]) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean loss per token over ``samples`` (each run alone) and its gradients."""
    data, _ = tiny_data()
    w = {name: t.clone().requires_grad_() for name, t in tiny_weights().items()}
    total, count = torch.zeros(()), 0
    for i in samples:
        tokens = data[i]
        h = causal_mean(w["emb"][tokens], [0, tokens.numel()])
        logits = logits_of(h, lambda x: x @ w["up"].T, lambda x: x @ w["down"].T, w)
        total = total + torch.nn.functional.cross_entropy(logits[:-1], tokens[1:], reduction="sum")
        count += tokens.numel() - 1
    (total / count).backward()
    return float(total / count), {name: t.grad for name, t in w.items()}


class _CudaToCpu(torch.overrides.TorchFunctionMode):
    """Factory calls with ``device="cuda"`` (the schedules' token counter) made on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _megatron_worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    # megatron-core 0.19's CUDA-only lines, pointed at the CPU in this process only: the
    # pipeline's receive buffers (torch.cuda.current_device()), its torch.cuda.synchronize()
    # after batched send/recv, and the schedules' token counter (_CudaToCpu).
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    from megatron.core import parallel_state

    results = []
    for tp, pp in ((2, 1), (1, 2)):
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            distributed_timeout_minutes=1,
        )
        try:
            results.extend(_megatron_run(tp, pp))
        finally:
            parallel_state.destroy_model_parallel()
    return results


def _megatron_run(tp: int, pp: int) -> list[dict[str, Any]]:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.enums import ModelType
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        use_cpu_initialization=True,
        calculate_per_token_loss=True,
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",  # the default refuses variable_seq_lengths
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
    )
    config.finalize_model_grads_func = finalize_model_grads
    check_config(config)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    weights = tiny_weights()
    shard = slice(tp_rank * FFN // tp, (tp_rank + 1) * FFN // tp)

    class Chunk(torch.nn.Module):
        """This pipeline stage of the tiny model, with the attributes megatron-core reads;
        finish_grad_sync / scale_gradients do what Megatron's DistributedDataParallel does with
        calculate_per_token_loss (sum over data-parallel ranks, then scale)."""

        def __init__(self) -> None:
            super().__init__()
            self.config, self.ddp_config = config, DistributedDataParallelConfig()
            self.model_type = ModelType.encoder_or_decoder
            self.pre_process = parallel_state.is_pipeline_first_stage()
            self.post_process = parallel_state.is_pipeline_last_stage()
            self.share_embeddings_and_output_weights = False
            self.input_tensor: torch.Tensor | None = None
            if self.pre_process:
                self.emb = torch.nn.Parameter(weights["emb"].clone())
            if self.post_process:
                init = torch.nn.init.zeros_
                self.up = ColumnParallelLinear(
                    HIDDEN, FFN, config=config, init_method=init, bias=False, gather_output=False
                )
                self.down = RowParallelLinear(
                    FFN, HIDDEN, config=config, init_method=init, bias=False,
                    input_is_parallel=True, skip_bias_add=False,
                )  # fmt: skip
                with torch.no_grad():
                    self.up.weight.copy_(weights["up"][shard])
                    self.down.weight.copy_(weights["down"][:, shard])
                self.head_w = torch.nn.Parameter(weights["head_w"].clone())
                self.head_b = torch.nn.Parameter(weights["head_b"].clone())

        def set_input_tensor(self, tensor: Any) -> None:
            self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

        def forward(self, tokens: Any, labels: Any, params: PackedSeqParams) -> torch.Tensor:
            if self.pre_process:
                bounds = params.cu_seqlens_q_padded.tolist()
                hidden = causal_mean(self.emb[tokens[0]], bounds)[:, None]
            else:
                hidden = self.input_tensor
            if not self.post_process:
                return hidden  # [tokens, 1, hidden] to the next stage
            head = {"head_w": self.head_w, "head_b": self.head_b}
            logits = logits_of(hidden, lambda x: self.up(x)[0], lambda x: self.down(x)[0], head)
            return torch.nn.functional.cross_entropy(
                logits[:, 0], labels[0], ignore_index=IGNORE_INDEX, reduction="none"
            )

        def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
            group = parallel_state.get_data_parallel_group(with_context_parallel=True)
            for p in self.parameters():
                dist.all_reduce(p.grad, group=group)

        def scale_gradients(self, scaling: Any) -> None:
            for p in self.parameters():
                p.grad *= scaling

    model = Chunk()
    data, lengths = tiny_data()
    iterator = MegatronDataIterator(  # data-parallel position from parallel_state
        data, lengths, global_batch_size=STEP_SAMPLES, max_tokens=MAX_TOKENS, pad_multiple=2,
        shuffle=False, cost="tokens",
    )  # fmt: skip

    def forward_step(data_iterator: Any, chunk: Chunk) -> tuple[torch.Tensor, Any]:
        batch = next(data_iterator)
        params = PackedSeqParams(**batch["packed_seq_params"])
        output = chunk(batch["tokens"], batch["labels"], params)
        return output, partial(per_token_loss, loss_mask=batch["loss_mask"])

    forward_backward = get_forward_backward_func()
    results = []
    for step in iterator.steps():
        with _CudaToCpu():
            losses = forward_backward(
                forward_step_func=forward_step, data_iterator=step, model=[model],
                num_microbatches=step.num_microbatches, seq_length=MAX_TOKENS,
                micro_batch_size=1,
            )  # fmt: skip
        last = parallel_state.is_pipeline_last_stage()
        results.append(
            {
                "schedule": forward_backward.__name__,
                "tp": tp,
                "tp_rank": tp_rank,
                "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
                "dp_rank": parallel_state.get_data_parallel_rank(),
                "indices": step.indices,
                "loss": step_loss(losses) if last else None,
                "pairs": [entry["lm loss"].tolist() for entry in losses],
                "grads": {
                    "emb": model.emb.grad.clone() if model.pre_process else None,
                    **(
                        {
                            "up": model.up.weight.grad.clone(),
                            "down": model.down.weight.grad.clone(),
                            "head_w": model.head_w.grad.clone(),
                            "head_b": model.head_b.grad.clone(),
                        }
                        if last
                        else {}
                    ),
                },
            }
        )
        model.zero_grad(set_to_none=False)
    return results


def _megatron_and_hybrid_worker(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "schedules": _megatron_worker(rank, world_size),
        "hybrid": _hybrid_worker(rank, world_size),
    }


@pytest.fixture(scope="module")
def megatron_runs(tmp_path_factory) -> list[dict[str, Any]]:
    """One launch of 4 gloo processes for every test that runs megatron-core's schedules (each
    rank imports megatron-core once): the plain and pipelined schedules, then the hybrid one.
    Four ranks import megatron-core at once on a shared CPU: generous collective timeout."""
    log_dir = tmp_path_factory.mktemp("megatron")
    assert 2 * DP == 4  # the hybrid schedule's DPxCP group is the same four ranks
    return launch(
        _megatron_and_hybrid_worker, 4, timeout=400, collective_timeout=90, log_dir=log_dir
    )


@needs_megatron
@pytest.mark.multiprocess
def test_megatron_schedules_give_the_token_mean_loss_and_gradients(megatron_runs) -> None:
    runs = [run["schedules"] for run in megatron_runs]
    schedules = (
        "forward_backward_no_pipelining",
        "forward_backward_pipelining_without_interleaving",
    )
    for phase, schedule in enumerate(schedules):
        counts = []
        for s, step_lengths in enumerate(STEP_LENGTHS):
            samples = list(range(s * STEP_SAMPLES, s * STEP_SAMPLES + len(step_lengths)))
            records = [run[2 * phase + s] for run in runs]
            assert {r["schedule"] for r in records} == {schedule}
            # The tensor- / pipeline-parallel peers of a replica got the same micro-batches;
            # the replicas together got the step's samples, each once.
            replicas: dict[int, list[Any]] = {}
            for r in records:
                replicas.setdefault(r["dp_rank"], []).append(r["indices"])
            assert sorted(replicas) == list(range(DP))
            assert all(peer == same[0] for same in replicas.values() for peer in same)
            got = sorted(i for same in replicas.values() for mb in same[0] for i in mb)
            assert got == samples
            (count,) = {len(r["indices"]) for r in records}
            counts.append(count)

            want_loss, want = reference(samples)
            last = [r for r in records if r["loss"] is not None]
            assert len(last) == (2 * DP if phase == 0 else DP)
            for r in last:
                assert r["loss"] == pytest.approx(want_loss, rel=1e-5)
            # Megatron's default normalisation (each micro-batch's own mean) would differ where
            # the micro-batches hold different token counts (step 1; in step 0 they are equal).
            pairs = [pair for r in last if r["tp_rank"] == 0 for pair in r["pairs"]]
            mean_of_means = np.mean([total / n for total, n in pairs])
            assert (abs(mean_of_means - want_loss) > 1e-3) == (s == 1)
            for r in records:
                grads = r["grads"]
                if grads["emb"] is not None:
                    torch.testing.assert_close(grads["emb"], want["emb"])
                if "head_w" in grads:
                    torch.testing.assert_close(grads["head_w"], want["head_w"])
                    torch.testing.assert_close(grads["head_b"], want["head_b"])
            for dp_rank in range(DP):
                shards = sorted(
                    (r["tp_rank"], r["grads"])
                    for r in last
                    if r["dp_rank"] == dp_rank
                )  # fmt: skip
                up = torch.cat([g["up"] for _, g in shards], 0)
                down = torch.cat([g["down"] for _, g in shards], 1)
                torch.testing.assert_close(up, want["up"])
                torch.testing.assert_close(down, want["down"])
        assert counts == [1, 3]  # a micro-batch count of its own per step


def test_iterator_refuses_empty_microbatches() -> None:
    """Megatron runs forward_step num_microbatches times on every rank: a rank left without a
    sample in one of them has nothing to pack, so allow_empty is refused up front (it failed in
    the middle of a step, at pack time)."""
    lengths = [5, 6, 7, 8, 9, 10, 11, 12]
    dataset = [list(range(1, n + 1)) for n in lengths]
    with pytest.raises(ValueError, match="allow_empty=True"):
        MegatronDataIterator(
            dataset, lengths, global_batch_size=8, dp_rank=0, dp_size=4, allow_empty=True
        )


def test_a_step_too_small_for_its_microbatches_names_what_megatron_runs() -> None:
    """The refusal of a step with fewer samples than micro-batch slots suggested
    ``allow_empty=True``, which the iterator refuses, and ``drop_last=True``, which it already
    sets (and called a full last step "the last, partial global batch"); it names what plans
    the step instead, at construction and at a step the cap makes too small."""
    lengths = np.array([100, 200, 300, 400, 500, 600, 700, 800])
    dataset = [np.arange(n) for n in lengths]
    with pytest.raises(ValueError) as refusal:
        MegatronDataIterator(
            dataset, lengths, global_batch_size=6, dp_rank=0, dp_size=2, num_microbatches=4
        )
    assert str(refusal.value) == (
        "epoch 0: step 0 holds 6 samples, fewer than its 8 micro-batch slots (dp_size = 2 x 4 "
        "micro-batches), so it cannot be planned without an empty micro-batch; Megatron runs "
        "every micro-batch on every rank, none empty: a larger global_batch_size, or fewer "
        "micro-batches per step (a smaller num_microbatches, min_microbatches or "
        "microbatch_multiple, a larger max_tokens)"
    )
    at_a_step = MegatronDataIterator(
        dataset, np.full(8, 100), global_batch_size=8, dp_rank=0, dp_size=2,
        microbatch_multiple=3, max_tokens=100,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^epoch 0, step 0: lengths has 8 samples") as refusal:
        next(at_a_step.steps())
    assert "allow_empty" not in str(refusal.value)
    assert "Megatron runs every micro-batch on every rank" in str(refusal.value)


def test_pack_refuses_a_sample_of_another_length_than_planned() -> None:
    """The plan (and its cap) is made from ``lengths``: a sample of another length would pack a
    micro-batch over the cap without a word."""
    lengths = [5, 6, 7, 8]
    dataset = [list(range(1, n + 1)) for n in lengths]
    dataset[2] = dataset[2] + [9]
    it = MegatronDataIterator(dataset, lengths, global_batch_size=4, dp_rank=0, dp_size=1)
    with pytest.raises(ValueError, match=r"dataset\[2\] has 8 tokens but lengths\[2\] = 7"):
        for step in it.steps():
            list(step)
    with pytest.raises(ValueError, match="dataset has 3 samples but lengths has 4"):
        MegatronDataIterator(dataset[:3], lengths, global_batch_size=4, dp_rank=0, dp_size=1)


def test_iterator_refuses_empty_samples_up_front() -> None:
    """An empty sequence cannot be packed; it failed in the middle of its step, naming its place
    in the micro-batch rather than the dataset."""
    lengths = [3, 0, 4, 5]
    dataset = [list(range(1, n + 1)) for n in lengths]
    with pytest.raises(ValueError, match=r"lengths\[1\] = 0"):
        MegatronDataIterator(dataset, lengths, global_batch_size=2, dp_rank=0, dp_size=1)


def test_iterator_plans_unpadded_lengths_without_a_copy() -> None:
    """mend13 L2: without padding the sampler plans the checked lengths themselves (the padded
    copy cost 800 MB at 100M samples); with padding, the padded ones."""
    lengths = np.array([5, 7, 3, 9, 4, 6, 2, 8])
    dataset = [list(range(1, n + 1)) for n in lengths]
    for pad_multiple, planned in ((1, lengths), (4, [8, 8, 4, 12, 4, 8, 4, 8])):
        it = MegatronDataIterator(
            dataset, lengths, global_batch_size=4, dp_rank=0, dp_size=2, pad_multiple=pad_multiple
        )
        values = it.sampler._source.values
        assert values.tolist() == list(planned)
        assert np.shares_memory(values, it._lengths) == (pad_multiple == 1)


def counting_planner(it: MegatronDataIterator) -> list[int]:
    """Wrap the iterator's planner: the returned list grows by one per step planned."""
    calls: list[int] = []
    plan = it.sampler.plan_step

    def counted(indices, options):  # type: ignore[no-untyped-def]
        calls.append(len(indices))
        return plan(indices, options)

    it.sampler.plan_step = counted
    return calls


def test_steps_are_planned_just_ahead_and_once() -> None:
    """The first step comes after planning at most the lookahead (not the epoch), every step is
    planned exactly once, and each step's micro-batches are those of the eager epoch plan."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 300, 4000)
    dataset = [np.arange(n) for n in lengths]
    it = MegatronDataIterator(
        dataset, lengths, global_batch_size=64, dp_rank=1, dp_size=4, max_tokens=1200
    )
    eager = it.sampler.epoch_plan().steps  # planned on its own (not through the iterator)
    calls = counting_planner(it)
    steps = it.steps()
    first = next(steps)
    assert len(calls) <= it.sampler.lookahead + 2 < it.num_steps() == len(eager) == 62
    got = [first.indices, *(step.indices for step in steps)]
    assert len(calls) == it.num_steps()
    layout = it.sampler.layout()
    want = [[layout.step(k)[mb].tolist() for mb in plan.ranks[1]] for k, plan in enumerate(eager)]
    assert got == want


@pytest.mark.parametrize("num_microbatches", [None, 5])
def test_resume_at_every_position_continues_the_same_steps(num_microbatches) -> None:
    (fresh,), _ = iterators(1, num_microbatches=num_microbatches)
    all_steps = [step.indices for step in fresh.steps()]
    flat = [mb for step in all_steps for mb in step]
    bounds = np.cumsum([0, *map(len, all_steps)]).tolist()
    for consumed in range(len(flat) + 1):
        (it,), _ = iterators(1, num_microbatches=num_microbatches)
        for _ in range(consumed):
            next(it)
        (resumed,), _ = iterators(1, num_microbatches=num_microbatches)
        resumed.load_state_dict(it.state_dict())
        if consumed in bounds:
            assert [s.indices for s in resumed.steps()] == all_steps[bounds.index(consumed) :]
        else:
            with pytest.raises(ValueError, match="inside a step"):
                next(resumed.steps())
            rest = [resumed._next_indices() for _ in range(len(flat) - consumed)]
            assert rest == flat[consumed:]


# --- megatron-core's hybrid (dynamic) context parallelism, fed a seqbalance CP plan ------------
#
# A per-token model (embedding -> MLP -> output layer, no attention), so a CP member's loss over
# its zigzag share needs nothing from its partners: the step's loss and gradients equal one
# process running each sample whole iff every token ran exactly once on the DPxCP group.

HYBRID_CAP = 32
HYBRID_LENGTHS = [96, 56, 24, 16, 16, 8, 8, 8, 24, 16]  # 96 needs 4 ranks, 56 two


def hybrid_plan() -> Any:
    from seqbalance import PlanOptions, plan_step
    from seqbalance.plan.context_parallel import ContextParallel

    options = PlanOptions(
        cost="flops",
        model="qwen3-8b",
        max_tokens=HYBRID_CAP,
        context_parallel=ContextParallel(sizes=hybrid_cp_sizes(4)),
    )
    return plan_step(HYBRID_LENGTHS, 4, options)


def hybrid_data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in HYBRID_LENGTHS]


EPOCH_SEED = 11
"""A layout with whole samples, samples sharded over 2 and over 4 ranks, and slots in which a
rank runs shares of two sharded samples (so CP partners must agree on their order)."""


def hybrid_epoch_data() -> tuple[list[torch.Tensor], np.ndarray]:
    rng = np.random.default_rng(EPOCH_SEED)
    lengths = np.concatenate(
        [rng.integers(2, 33, 16), rng.integers(33, 65, 5), rng.integers(65, 129, 3)]
    )
    g = torch.Generator().manual_seed(EPOCH_SEED)
    return [torch.randint(0, VOCAB, (int(n),), generator=g) for n in lengths], lengths


def hybrid_iterator(**overrides: Any) -> MegatronDataIterator:
    """24 samples, 3 steps of 8 over a DPxCP group of 4 (cap 32 tokens per rank and slot)."""
    data, lengths = hybrid_epoch_data()
    settings: dict[str, Any] = {
        "global_batch_size": 8,
        "max_tokens": HYBRID_CAP,
        "context_parallel": ContextParallel(sizes=hybrid_cp_sizes(4)),
        "cost": "flops",
        "model": "qwen3-8b",
        "seed": EPOCH_SEED,
    }
    return MegatronDataIterator(data, lengths, **{**settings, **overrides})


def test_hybrid_iterator_steps_agree_cover_every_sample_and_resume() -> None:
    """Per step, every DPxCP rank gets the plan's sample_id_groups and exactly the whole samples
    it lists (padded for the zigzag split); the epoch covers every sample once; each step is
    planned once; resuming at every step boundary, or taking steps as ``next(iterator)``,
    continues with the same steps."""
    data, lengths = hybrid_epoch_data()
    made = [hybrid_iterator(dp_rank=r, dp_size=4) for r in range(4)]
    calls = counting_planner(made[0])
    runs = [list(it.steps()) for it in made]
    assert len(calls) == made[0].num_steps() == 3
    seen: list[int] = []
    for steps in zip(*runs, strict=True):
        plan = steps[0].plan
        assert all(step.sample_id_groups == hybrid_cp_groups(plan) for step in steps)
        assert {step.num_microbatches for step in steps} == {plan.n_slots}
        step_samples = set()
        for rank, step in enumerate(steps):
            batch, groups = next(step)
            with pytest.raises(StopIteration):
                next(step)
            assert sorted(batch) == sorted(step.indices)
            assert set(batch) == {i for group in groups for i in group[rank]}
            for sample, packed in batch.items():
                index, size = step.indices[sample], int(plan.cp_size[sample])
                n, multiple = int(lengths[index]), 2 * size if size > 1 else 1
                assert packed["tokens"][0, :n].tolist() == data[index].tolist()
                assert packed["tokens"].shape[1] % multiple == 0
                assert packed["tokens"].shape[1] < n + multiple
                assert packed["cu_seqlens"].tolist() == [0, n]
                step_samples.add(index)
        assert len(step_samples) == 8
        seen.extend(step_samples)
    assert sorted(seen) == list(range(len(data)))
    assert {int(c) for steps in runs[0] for c in steps.plan.cp_size} == {1, 2, 4}
    for k in range(len(runs[1]) + 1):
        it = hybrid_iterator(dp_rank=1, dp_size=4)
        for step in runs[1][:k]:
            batch, groups = next(it)  # Megatron-LM's data_iterator=iterator form
            assert (sorted(batch), groups) == (sorted(step.indices), step.sample_id_groups)
        resumed = hybrid_iterator(dp_rank=1, dp_size=4)
        resumed.load_state_dict(it.state_dict())
        rest = [(s.indices, s.sample_id_groups) for s in resumed.steps()]
        assert rest == [(s.indices, s.sample_id_groups) for s in runs[1][k:]]
    with pytest.raises(StopIteration):
        next(it)


def test_hybrid_iterator_refuses_what_megatron_cannot_run() -> None:
    from seqbalance import PlanOptions, plan_step

    data, lengths = hybrid_epoch_data()
    with pytest.raises(ValueError, match=r"sizes holds \[3\].*hybrid_cp_sizes\(6\) = \[1, 2, 6\]"):
        MegatronDataIterator(
            data, lengths, global_batch_size=12, dp_rank=0, dp_size=6, max_tokens=HYBRID_CAP,
            context_parallel=ContextParallel(sizes=(1, 2, 3, 6)), cost="flops", model="qwen3-8b",
        )  # fmt: skip
    contiguous = ContextParallel(sizes=hybrid_cp_sizes(4), scheme="contiguous")
    with pytest.raises(ValueError, match="zigzag split"):
        hybrid_iterator(dp_rank=0, dp_size=4, context_parallel=contiguous)
    with pytest.raises(ValueError, match="allow_empty=True is not supported"):
        hybrid_iterator(dp_rank=0, dp_size=4, allow_empty=True)
    sparse = PlanOptions(
        cost="flops", model="qwen3-8b", max_tokens=8, allow_empty=True,
        context_parallel=ContextParallel(sizes=(1,)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="rank 1 has no sample in the plan's last slot"):
        hybrid_cp_groups(plan_step([8], 4, sparse))


def test_hybrid_cp_batch_lists_every_piece_once_in_one_order() -> None:
    plan, data = hybrid_plan(), hybrid_data()
    assert plan.cp_size.max() > 1  # some samples are sharded
    runs = [hybrid_cp_batch(plan, r, data) for r in range(4)]
    groups = runs[0][1]
    assert all(run[1] == groups for run in runs) and len(groups) == plan.n_slots
    for slot, ranks in enumerate(groups):
        assert all(ranks)  # Megatron asserts every rank has a sample in every group
        for sample in {i for ids in ranks for i in ids}:
            members = [r for r in range(4) if sample in ranks[r]]
            assert members == list(plan.cp_group(sample)) and plan.slot_of()[sample] == slot
        # one order: any two samples two ranks share come in the same order on both
        for a, b in itertools.combinations(range(4), 2):
            shared = [i for i in ranks[a] if i in ranks[b]]
            assert shared == [i for i in ranks[b] if i in ranks[a]]
    for rank, (batch, _) in enumerate(runs):
        assert sorted(batch) == sorted({i for ranks in groups for i in ranks[rank]})
        for i, sample in batch.items():
            size = int(plan.cp_size[i])
            assert sample["tokens"][0, : HYBRID_LENGTHS[i]].tolist() == data[i].tolist()
            assert sample["tokens"].shape[1] % (2 * size if size > 1 else 1) == 0
            assert sample["cu_seqlens"].tolist() == [0, HYBRID_LENGTHS[i]]
    with pytest.raises(ValueError, match="rank must be in"):
        hybrid_cp_batch(plan, 4, data)
    with pytest.raises(ValueError, match=r"samples\[2\] has 3 tokens"):
        hybrid_cp_batch(plan, 0, [*data[:2], data[2][:3], *data[3:]])


def _hybrid_worker(rank: int, world_size: int) -> dict[str, Any]:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        hybrid_context_parallel=True, distributed_timeout_minutes=1
    )
    try:
        model = _hybrid_model()
        rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
        plan = hybrid_plan()
        item = hybrid_cp_batch(plan, rank, hybrid_data())
        ran, losses = _hybrid_step(model, iter([item]), plan.n_slots)
        result = {"rank": rank, "ran": len(ran), "loss": step_loss(losses)}
        result["grads"] = {name: p.grad.clone() for name, p in model.w.items()}
        return {**result, **_hybrid_epoch(model)}
    finally:
        parallel_state.destroy_model_parallel()


def _hybrid_model() -> torch.nn.Module:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.enums import ModelType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=2, use_cpu_initialization=True,
        calculate_per_token_loss=True, variable_seq_lengths=True, pipeline_dtype=torch.float32,
        moe_token_dispatcher_type="alltoall", hybrid_context_parallel=True,
        max_seqlen_per_dp_cp_rank=HYBRID_CAP,
    )  # fmt: skip
    config.finalize_model_grads_func = finalize_model_grads
    weights = tiny_weights()

    class PerToken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config, self.ddp_config = config, DistributedDataParallelConfig()
            self.model_type = ModelType.encoder_or_decoder
            self.w = torch.nn.ParameterDict(
                {name: torch.nn.Parameter(t.clone()) for name, t in weights.items()}
            )

        def set_input_tensor(self, tensor: Any) -> None:
            pass

        def forward(self, tokens: Any, labels: Any) -> torch.Tensor:
            w = self.w
            logits = logits_of(w["emb"][tokens[0]], lambda x: x @ w["up"].T,
                               lambda x: x @ w["down"].T, w)  # fmt: skip
            return torch.nn.functional.cross_entropy(
                logits, labels[0], ignore_index=IGNORE_INDEX, reduction="none"
            )

        def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
            group = parallel_state.get_data_parallel_group(with_context_parallel=True)
            for p in self.parameters():
                dist.all_reduce(p.grad, group=group)

        def scale_gradients(self, scaling: Any) -> None:
            for p in self.parameters():
                p.grad *= scaling

    return PerToken()


def _hybrid_epoch(model: Any) -> dict[str, Any]:
    """A MegatronDataIterator epoch on the hybrid schedule: step 0 from ``steps()``, then a
    fresh iterator resumed from its state feeds the rest as ``data_iterator=iterator``
    (Megatron-LM's training loop); last, one rank's iterator set up differently."""
    from megatron.core import parallel_state

    def record(ran: list, losses: list, groups: list) -> dict[str, Any]:
        grads = {name: p.grad.clone() for name, p in model.w.items()}
        return {"ran": ran, "loss": step_loss(losses), "groups": groups, "grads": grads}

    first_pass = hybrid_iterator()  # the DPxCP position from parallel_state
    step = next(first_pass.steps())
    ran, losses = _hybrid_step(model, step, step.num_microbatches)
    epoch = [record(ran, losses, step.sample_id_groups)]
    resumed = hybrid_iterator()
    resumed.load_state_dict(first_pass.state_dict())
    seen: list[Any] = []
    spy = (seen.append(item) or item for item in resumed)
    for _ in range(resumed.num_steps() - 1):
        ran, losses = _hybrid_step(model, spy, resumed.microbatches_per_step()[0])
        epoch.append(record(ran, losses, seen[-1][1]))
    rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    odd = hybrid_iterator(seed=EPOCH_SEED + (rank == 3))
    try:
        next(odd.steps())
    except ValueError as error:
        return {"epoch": epoch, "disagreement": str(error)}
    return {"epoch": epoch, "disagreement": None}


def _hybrid_step(
    model: Any, data_iterator: Any, num_microbatches: int
) -> tuple[list[tuple[int, list[int], bool]], list]:
    """One step of megatron-core's hybrid schedule (gradients zeroed first): per forward pass,
    the sample's CP size, the positions of the real tokens this rank computed, and whether its
    CP partners ran the same sample at the same time (attention's exchange in the group, which
    a per-token model lacks: each member all-gathers the sample's length); the losses."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.utils import get_batch_on_this_cp_rank

    ran: list[tuple[int, list[int], bool]] = []
    for p in model.parameters():
        p.grad = None

    def forward_step(data_iterator: Any, chunk: Any) -> tuple[torch.Tensor, Any]:
        sample = get_batch_on_this_cp_rank(
            next(data_iterator), is_hybrid_cp=True,
            hybrid_cp_group_func=parallel_state.get_hybrid_data_context_parallel_groups,
        )  # fmt: skip
        size, length = int(sample["local_cp_size"]), int(sample["cu_seqlens"][-1])
        partners = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        if size > 1:
            dist.all_gather(partners, torch.tensor([length]), group=sample["hybrid_cp_group"])
        together = size == 1 or all(int(p) == length for p in partners)
        positions = sample["position_ids"][0]
        ran.append((size, positions[positions < length].tolist(), together))
        output = chunk(sample["tokens"], sample["labels"])
        return output, partial(per_token_loss, loss_mask=sample["loss_mask"])

    with _CudaToCpu():
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=data_iterator, model=[model],
            num_microbatches=num_microbatches, seq_length=HYBRID_CAP, micro_batch_size=1,
        )  # fmt: skip
    return ran, losses


def hybrid_reference(
    samples: list[torch.Tensor] | None = None,
) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean loss per token over ``samples`` (default: hybrid_data()), each whole, and its
    gradients, in one process."""
    w = {name: t.clone().requires_grad_() for name, t in tiny_weights().items()}
    total, count = torch.zeros(()), 0
    for tokens in hybrid_data() if samples is None else samples:
        logits = logits_of(w["emb"][tokens], lambda x: x @ w["up"].T, lambda x: x @ w["down"].T, w)
        total = total + torch.nn.functional.cross_entropy(logits[:-1], tokens[1:], reduction="sum")
        count += tokens.numel() - 1
    (total / count).backward()
    return float(total.detach() / count), {name: t.grad for name, t in w.items()}


@pytest.fixture(scope="module")
def hybrid_runs(megatron_runs) -> list[dict[str, Any]]:
    """Each rank's run of megatron-core's hybrid schedule (the shared launch)."""
    return [run["hybrid"] for run in megatron_runs]


@needs_megatron
@pytest.mark.multiprocess
def test_megatron_hybrid_cp_schedule_runs_a_seqbalance_plan(hybrid_runs) -> None:
    """megatron-core 0.19.2's hybrid-CP schedule on 4 gloo processes (one DPxCP group of 4, its
    power-of-two groups), fed hybrid_cp_batch of a seqbalance plan with samples sharded over 2
    and 4 ranks: the loss and every gradient equal one process running each sample whole."""
    runs = hybrid_runs
    plan = hybrid_plan()
    want_loss, want = hybrid_reference()
    assert sorted(run["rank"] for run in runs) == [0, 1, 2, 3]
    for run in runs:
        mine = sum(len(ranks[run["rank"]]) for ranks in hybrid_cp_batch(plan, 0, hybrid_data())[1])
        assert run["ran"] == mine  # one forward pass per listed sample
        assert run["loss"] == pytest.approx(want_loss, rel=1e-5)
        for name, grad in run["grads"].items():
            torch.testing.assert_close(grad, want[name])


@needs_megatron
@pytest.mark.multiprocess
def test_megatron_iterator_feeds_the_hybrid_schedule_an_epoch(hybrid_runs) -> None:
    """MegatronDataIterator(context_parallel=...) on megatron-core 0.19.2's hybrid schedule, 4
    gloo processes, an epoch of 3 steps (whole samples, samples sharded over 2 and 4 ranks; a
    resume after step 0, then ``data_iterator=iterator``): every rank runs the plan's groups, one
    forward pass per listed sample with the plan's CP size; over the epoch every token of every
    sample is computed exactly once on the DPxCP group; each step's loss and every gradient
    equal one process running the step's samples whole; a rank set up differently fails on
    every rank."""
    data, lengths = hybrid_epoch_data()
    it = hybrid_iterator(dp_rank=0, dp_size=4)
    layout = it.sampler.layout()
    computed: dict[int, list[int]] = {index: [] for index in range(len(data))}
    for k in range(layout.n_steps):
        indices, plan = layout.step(k), it.sampler.step_plan(k)
        want_loss, want = hybrid_reference([data[i] for i in indices])
        groups = hybrid_cp_groups(plan)
        for run in hybrid_runs:
            got = run["epoch"][k]
            assert got["groups"] == groups
            listed = [sample for group in groups for sample in group[run["rank"]]]
            assert len(got["ran"]) == len(listed)
            for sample, (cp_size, positions, together) in zip(listed, got["ran"], strict=True):
                assert cp_size == plan.cp_size[sample] and together
                computed[int(indices[sample])].extend(positions)
            assert got["loss"] == pytest.approx(want_loss, rel=1e-5)
            for name, grad in got["grads"].items():
                torch.testing.assert_close(grad, want[name])
    for index, positions in computed.items():
        assert sorted(positions) == list(range(lengths[index])), index
    shared = [
        [sample for sample in ids if it.sampler.step_plan(k).cp_size[sample] > 1]
        for k in range(layout.n_steps)
        for group in hybrid_cp_groups(it.sampler.step_plan(k))
        for ids in group
    ]
    assert max(map(len, shared)) >= 2  # the order of a rank's sharded samples was exercised
    for run in hybrid_runs:
        assert "set up their samplers differently" in run["disagreement"]
        assert "seed" in run["disagreement"]
