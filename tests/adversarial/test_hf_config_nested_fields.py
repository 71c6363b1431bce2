"""Adversarial (adv13c D4): a Hugging Face config's nested configs and ``model_type`` of other
kinds. ``text_config`` / ``vision_config`` given as a string were read as a path: ``""`` or
``"."`` read the working directory's ``config.json`` (a Gemma 3 config became that model's
spec without a word), any other string that file; a ``model_type`` that is a list or a
mapping raised ``TypeError: unhashable type``. Each is now a ValueError naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from seqbalance.cost import ModelSpec, VisionSpec

PRESETS = Path(__file__).parents[2] / "src" / "seqbalance" / "cost" / "presets"
GEMMA = json.loads((PRESETS / "gemma-3-27b.json").read_text())
LLAMA = json.loads((PRESETS / "llama-3.1-8b.json").read_text())


@pytest.mark.parametrize("value", ["", ".", "config.json"])
@pytest.mark.parametrize("field", ["text_config", "vision_config"])
def test_a_nested_config_given_as_a_string_is_not_read_as_a_path(
    tmp_path, monkeypatch, field, value
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    monkeypatch.chdir(tmp_path)
    config = copy.deepcopy(GEMMA)
    config[field] = value
    message = rf"config field '{field}' must be a mapping of fields, got '{value}'"
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_hf_config(config)
    if field == "vision_config":
        with pytest.raises(ValueError, match=message):
            VisionSpec.from_hf_config(config)


@pytest.mark.parametrize("value", [["gemma3_text"], {"a": 1}])
def test_a_model_type_that_is_no_string_is_named(value) -> None:
    config = copy.deepcopy(LLAMA)
    config["model_type"] = value
    with pytest.raises(ValueError, match="config field 'model_type' must be a string, got"):
        ModelSpec.from_hf_config(config)
    nested = copy.deepcopy(GEMMA)
    nested["text_config"]["model_type"] = value
    with pytest.raises(ValueError, match="config field 'model_type' must be a string, got"):
        ModelSpec.from_hf_config(nested)
    assert ModelSpec.from_hf_config(GEMMA).vision_config == GEMMA["vision_config"]
