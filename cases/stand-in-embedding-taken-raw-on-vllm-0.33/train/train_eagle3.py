"""Online EAGLE-3 training of a draft for Gemma-4: the target under transformers for its hidden
states (output_hidden_states, entry k is the output of layer k-1), the draft's token embeddings
from a stand-in that keeps the target's embedding (stand_in.py), the draft from draft_model.py."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from draft_model import LlamaForCausalLMEagle3, load_batches
from stand_in import FakeBaseModel

TARGET = "google/gemma-4-E4B"
TAPS = [1, 20, 38]  # the states vLLM captures for the config's ids [1, 20, 38]


def main():
    target = AutoModelForCausalLM.from_pretrained(TARGET, torch_dtype=torch.bfloat16)
    target.eval()
    base = FakeBaseModel.from_source(AutoConfig.from_pretrained(TARGET), "target/model.safetensors")
    draft = LlamaForCausalLMEagle3.from_config("draft/config.json")
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    for batch in load_batches("data/sharegpt.jsonl"):
        with torch.no_grad():
            outputs = target(input_ids=batch["input_ids"], output_hidden_states=True)
            embeds = base.embed_tokens(batch["input_ids"])
        hs = outputs.hidden_states
        features = torch.cat([hs[TAPS[0]], hs[TAPS[1]], hs[TAPS[2]]], dim=-1)
        logits = draft.compute_logits(draft(features, embeds))
        loss = torch.nn.functional.kl_div(logits.log_softmax(-1), outputs.logits.softmax(-1), reduction="batchmean")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
