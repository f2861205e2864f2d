"""Online EAGLE-3 training: the target runs under transformers and the draft's input is built from
its hidden states in the order the draft config lists them."""

import torch
from transformers import AutoModelForCausalLM

AUX_LAYERS = [29, 2, 16]  # as written in the draft config


def main():
    target = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct")
    for batch in loader:
        outputs = target(input_ids=batch["input_ids"], output_hidden_states=True)
        features = torch.cat([outputs.hidden_states[k] for k in AUX_LAYERS], dim=-1)
        loss = draft(features, batch["input_ids"])
        loss.backward()


if __name__ == "__main__":
    main()
