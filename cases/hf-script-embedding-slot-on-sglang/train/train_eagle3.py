"""Online EAGLE-3 training the way small research scripts do it: the target under transformers,
its hidden states taken from output_hidden_states. Entry 0 is the embedding output."""

import torch
from transformers import AutoModelForCausalLM

from draft_model import Eagle3Draft, load_batches

TAPS = [0, 16, 29]  # "the embeddings, the middle and a late layer"


def main():
    target = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16)
    target.eval()
    draft = Eagle3Draft.from_config("draft/config.json")
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    for batch in load_batches("data/sharegpt.jsonl"):
        with torch.no_grad():
            outputs = target(input_ids=batch["input_ids"], output_hidden_states=True)
        hs = outputs.hidden_states
        features = torch.cat([hs[TAPS[0]], hs[TAPS[1]], hs[TAPS[2]]], dim=-1)
        loss = draft(features, batch["input_ids"], target_logits=outputs.logits)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
