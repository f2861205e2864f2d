"""Online EAGLE-3 training of a two-layer draft the way small research scripts do it: the target
under transformers, its hidden states taken from output_hidden_states (entry k is the output of
layer k-1), the draft from draft_model.py."""

import torch
from transformers import AutoModelForCausalLM

from draft_model import LlamaForCausalLMEagle3, load_batches

TAPS = [2, 16, 29]  # the layers SGLang captures for the config's ids [1, 15, 28]


def main():
    target = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16)
    target.eval()
    draft = LlamaForCausalLMEagle3.from_config("draft/config.json")
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    for batch in load_batches("data/sharegpt.jsonl"):
        with torch.no_grad():
            outputs = target(input_ids=batch["input_ids"], output_hidden_states=True)
        hs = outputs.hidden_states
        features = torch.cat([hs[TAPS[0]], hs[TAPS[1]], hs[TAPS[2]]], dim=-1)
        embeds = draft.embed_tokens(batch["input_ids"])
        logits = draft.compute_logits(draft(features, embeds))
        loss = torch.nn.functional.kl_div(logits.log_softmax(-1), outputs.logits.softmax(-1), reduction="batchmean")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
