"""HF mixin before a trainer that builds its own training loader (adv19b D6).

TRL's GRPOTrainer, RLOOTrainer and DistillationTrainer override ``get_train_dataloader``: their
``RepeatSampler`` repeats each prompt ``num_generations`` times (and each generation batch over
the accumulation steps), and advantages are normalised over those groups. The mixin's loader
replaced theirs without a word (given ``seqbalance_lengths``): each prompt came once and the
groups the trainer normalised over were other prompts. Refused at construction, naming it.
"""

from __future__ import annotations

import pytest

from seqbalance.integrations.hf import BalancedTrainerMixin


class GRPOTrainer:
    """Stands in for a TRL trainer with its own loader (the MRO check runs before its init)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.built = True

    def get_train_dataloader(self) -> object:
        return "its own RepeatSampler loader"


class Balanced(BalancedTrainerMixin, GRPOTrainer):
    pass


def test_a_trainer_with_its_own_loader_is_refused() -> None:
    with pytest.raises(ValueError, match=r"GRPOTrainer builds its own training loader"):
        Balanced(seqbalance_lengths=[3, 4])
