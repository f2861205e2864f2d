"""In the shape of SGLang's vocabulary-parallel embedding (one rank: a plain embedding)."""

import torch


class VocabParallelEmbedding(torch.nn.Embedding):
    pass
