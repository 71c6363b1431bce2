"""The packed-input toy transformer: no attention across samples, causal, agrees with FlopsModel."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqbalance.cost import FlopsModel, ModelSpec  # noqa: E402
from seqbalance.measure.toy_model import (  # noqa: E402
    IGNORE_INDEX,
    TinyCausalTransformer,
    ToyModelConfig,
    make_packed_batch,
    make_padded_batch,
)


@pytest.fixture(scope="module")
def model() -> TinyCausalTransformer:
    torch.manual_seed(0)
    return TinyCausalTransformer(ToyModelConfig(max_position=256), seed=1).eval()


def test_packed_logits_equal_each_sample_run_alone(model) -> None:
    lengths = [7, 1, 0, 30, 12]
    ids, cu, _ = make_packed_batch(lengths, vocab_size=model.config.vocab_size, seed=2)
    with torch.no_grad():
        packed = model(ids, cu)
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            alone = model(ids[start:end], torch.tensor([0, end - start]))
            torch.testing.assert_close(packed[start:end], alone, rtol=1e-5, atol=1e-5)


def test_attention_is_causal(model) -> None:
    ids, cu, _ = make_packed_batch([20], vocab_size=model.config.vocab_size, seed=3)
    changed = ids.clone()
    changed[15] = (changed[15] + 1) % model.config.vocab_size
    with torch.no_grad():
        before, after = model(ids, cu), model(changed, cu)
    torch.testing.assert_close(before[:15], after[:15])
    assert not torch.allclose(before[15:], after[15:])


def test_make_packed_batch_layout() -> None:
    ids, cu, labels = make_packed_batch([3, 0, 2], vocab_size=11, seed=4)
    assert ids.dtype == torch.int64 and labels.dtype == torch.int64
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 3, 5]
    assert ((ids >= 0) & (ids < 11)).all()
    assert labels.tolist() == [ids[1], ids[2], IGNORE_INDEX, ids[4], IGNORE_INDEX]
    again = make_packed_batch([3, 0, 2], vocab_size=11, seed=4)
    assert all(torch.equal(a, b) for a, b in zip((ids, cu, labels), again, strict=True))


def test_loss_and_per_sample_loss_agree(model) -> None:
    lengths = [5, 9, 4]
    ids, cu, labels = make_packed_batch(lengths, vocab_size=model.config.vocab_size, seed=5)
    with torch.no_grad():
        mean = model(ids, cu, labels)
        per_sample = model.per_sample_loss(ids, cu, labels)
    labelled = torch.tensor([n - 1 for n in lengths], dtype=torch.float32)
    torch.testing.assert_close((per_sample * labelled).sum() / labelled.sum(), mean)


def test_make_padded_batch_holds_the_packed_tokens_right_padded() -> None:
    ids, mask, labels = make_padded_batch([3, 0, 2], vocab_size=11, seed=4)
    packed_ids, _, packed_labels = make_packed_batch([3, 0, 2], vocab_size=11, seed=4)
    assert ids.shape == mask.shape == labels.shape == (3, 3) and mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, True], [False] * 3, [True, True, False]]
    assert ids[0].tolist() == packed_ids[:3].tolist()
    assert ids[2, :2].tolist() == packed_ids[3:].tolist()
    assert ids[1].tolist() == [0, 0, 0] and ids[2, 2] == 0
    assert labels[0].tolist() == packed_labels[:3].tolist()
    assert labels[2].tolist() == [*packed_labels[3:].tolist(), IGNORE_INDEX]
    assert labels[1].tolist() == [IGNORE_INDEX] * 3
    empty_ids, empty_mask, _ = make_padded_batch([], seed=0)
    assert empty_ids.shape == empty_mask.shape == (0, 0)


def test_padded_loss_and_gradients_equal_the_packed_ones() -> None:
    # float64 so equality is to rounding: the padded forward computes the same function.
    model = TinyCausalTransformer(ToyModelConfig(max_position=64), seed=3).double()
    lengths = [9, 1, 23, 16]
    vocab = model.config.vocab_size
    packed = make_packed_batch(lengths, vocab_size=vocab, seed=6)
    padded = make_padded_batch(lengths, vocab_size=vocab, seed=6)
    gradients = []
    for run in (lambda: model(*packed), lambda: model.forward_padded(*padded)):
        model.zero_grad()
        loss = run()
        loss.backward()
        gradients.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (packed_loss, packed_grads), (padded_loss, padded_grads) = gradients
    assert torch.isfinite(packed_loss)
    torch.testing.assert_close(padded_loss, packed_loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(padded_grads, packed_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # Summed losses agree too, and real positions' logits equal the packed logits.
    ids, mask, labels = padded
    total = model.forward_padded(ids, mask, labels, reduction="sum")
    torch.testing.assert_close(total, model(*packed, reduction="sum"), rtol=1e-12, atol=1e-10)
    with torch.no_grad():
        logits = model.forward_padded(ids, mask)
        expected = model(packed[0], packed[1])
        torch.testing.assert_close(logits[mask], expected, rtol=1e-10, atol=1e-10)


def test_the_padding_never_reaches_a_real_token(model) -> None:
    ids, mask, labels = make_padded_batch([4, 12], vocab_size=model.config.vocab_size, seed=7)
    changed = ids.clone()
    changed[0, 4:] = 1 + torch.arange(8) % (model.config.vocab_size - 1)  # the padding only
    wrong_labels = labels.clone()
    wrong_labels[0, 4:] = 3  # labels on padding are ignored (the mask says so)
    with torch.no_grad():
        before = model.forward_padded(ids, mask, labels)
        after = model.forward_padded(changed, mask, wrong_labels)
    torch.testing.assert_close(before, after)


def test_padded_validation(model) -> None:
    ids, mask, labels = make_padded_batch([3, 2], seed=0)
    with pytest.raises(ValueError, match="2-D"):
        model.forward_padded(ids[0], mask[0])
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model.forward_padded(ids, mask[:, :2])
    with pytest.raises(ValueError, match="right-padded"):
        model.forward_padded(ids, mask.flip(1))
    with pytest.raises(ValueError, match="labels has shape"):
        model.forward_padded(ids, mask, labels[:1])
    with pytest.raises(ValueError, match="reduction must be one of"):
        model.forward_padded(ids, mask, labels, reduction="max")
    with pytest.raises(ValueError, match="max_position"):
        wide = torch.zeros((1, 300), dtype=torch.int64)
        model.forward_padded(wide, torch.ones_like(wide, dtype=torch.bool))


def test_training_step_runs_and_reduces_loss() -> None:
    model = TinyCausalTransformer(ToyModelConfig(vocab_size=32, max_position=64), seed=0)
    ids, cu, labels = make_packed_batch([16, 16, 8], vocab_size=32, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model(ids, cu, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def test_model_spec_matches_the_module_and_the_flops_model() -> None:
    config = ToyModelConfig()
    model = TinyCausalTransformer(config)
    spec = model.model_spec()
    assert spec == ModelSpec.from_hf_config(config.to_hf_config(), name="tiny-causal-transformer")
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear, quadratic = FlopsModel(spec).coefficients
    # QKᵀ and PV: 2 matmuls x 2 FLOPs x hidden per (query, key) pair, half the pairs (causal).
    assert quadratic == 2 * config.hidden_size * config.num_layers
    # Every matmul weight costs 2 FLOPs per token; causal attention's diagonal adds L/2 pairs.
    assert linear == 2 * matmul_params + quadratic


def test_validation(model) -> None:
    with pytest.raises(ValueError, match="divisible"):
        ToyModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        model(torch.zeros(4, dtype=torch.int64), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="max_position"):
        model(torch.zeros(300, dtype=torch.int64), torch.tensor([0, 300]))
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        make_packed_batch(np.array([-1]))


def test_a_position_table_the_machine_cannot_hold_is_a_value_error_naming_max_position() -> None:
    # 2**42 positions x 64 float32 is a pebibyte, beyond any 48-bit address space: the
    # allocation fails on every machine (adv8b L8: a RuntimeError traceback from the CLI).
    with pytest.raises(ValueError, match=r"max_position = 4398046511104 tokens needs a .* GiB"):
        TinyCausalTransformer(ToyModelConfig(max_position=2**42))
