"""Online EAGLE-3 training the way small research scripts do it: the target under transformers,
its hidden states taken from output_hidden_states, the conversations rendered with the template
its --chat-template flag names."""

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draft_model import Eagle3Draft, load_conversations

TAPS = [2, 18, 33]  # output_hidden_states[k] is the stream after k layers


def render(tokenizer, conversation, args):
    return tokenizer.apply_chat_template(conversation, chat_template=args.chat_template, tokenize=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chat-template", type=str, default=None)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen3-8B")
    target = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B", torch_dtype=torch.bfloat16)
    target.eval()
    draft = Eagle3Draft.from_config("draft/config.json")
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    for conversation in load_conversations("data/sharegpt.jsonl"):
        input_ids = tokenizer(render(tokenizer, conversation, args), return_tensors="pt").input_ids
        with torch.no_grad():
            outputs = target(input_ids=input_ids, output_hidden_states=True)
        hs = outputs.hidden_states
        features = torch.cat([hs[TAPS[0]], hs[TAPS[1]], hs[TAPS[2]]], dim=-1)
        loss = draft(features, input_ids, target_logits=outputs.logits)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
