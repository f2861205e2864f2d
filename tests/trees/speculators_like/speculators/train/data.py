"""The dump reader in the shape of speculators 0.4.0 train/data.py."""

from typing import Any

import torch


def standardize_data_v1(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "hidden_states": torch.cat(data["hidden_states"][:-1], dim=-1),
        "input_ids": data["input_ids"],
        "verifier_last_hidden_states": data["hidden_states"][-1],
        "loss_mask": data["loss_mask"],
    }


class Eagle3SampleFileDataset:
    def __init__(self, max_len, datapath=None, standardize_fn=standardize_data_v1):
        self.standardize_fn = standardize_fn

    def __getitem__(self, index):
        data = torch.load(self.files[index], weights_only=True)
        return self.standardize_fn(data)
