"""Fixtures the torch executor's tests share."""

from __future__ import annotations

import pytest
from torch_helpers import hf_config, hf_model

from enginekit.models.tiny import random_state_dict


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """(folder, transformers model) of the tiny Llama on seeded weights."""
    config = hf_config("tiny")
    model = hf_model(config, random_state_dict(config, seed=3))
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    return folder, model
