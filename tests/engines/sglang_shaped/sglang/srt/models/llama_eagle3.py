"""In the shape of SGLang's EAGLE-3 draft: its own embedding, and `model.fc` over the target's
concatenated hidden states, called inside the draft's forward (input ids, positions, ...)."""

import torch

from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding


class LlamaModel(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, slots):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(vocab_size, hidden_size)
        self.fc = torch.nn.Linear(slots * hidden_size, hidden_size, bias=False)

    def forward(self, input_ids, positions, hidden_states):
        embeds = self.embed_tokens(input_ids)
        return embeds + self.fc(hidden_states)


class LlamaForCausalLMEagle3(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, slots):
        super().__init__()
        self.model = LlamaModel(vocab_size, hidden_size, slots)

    def forward(self, input_ids, positions, hidden_states=None):
        return self.model(input_ids, positions, hidden_states)
