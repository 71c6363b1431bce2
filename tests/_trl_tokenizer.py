"""The offline tokenizer the TRL tests count with (import with ``from _trl_tokenizer import ...``).

A byte-level BPE trained here on a few sentences (merges across the prompt/completion boundary
happen), saved as a Hugging Face directory with a BOS-adding post-processor and a chat template
that uses ``{% generation %}`` and ``tools``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{% generation %}{{ m['content'] }}</s>"
    "{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = [
    "The sky is blue and the sea is green.",
    "What color is the sky? It is blue.",
    "Where is the sun? In the sky, far away from the sea.",
    "Tokens merge across boundaries: skyline, seaside, sunshine.",
    "def add(a, b):\n    return a + b\n",
]


def make_tokenizer(directory: Path, template: str | None = TEMPLATE) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|tools|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(CORPUS * 3, trainer)
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
    }
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
