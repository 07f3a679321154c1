"""Builds the model fixtures of `tests/fixtures/models/` from the reference implementation.

Run by hand in a virtual environment with torch and transformers (never a build or CI
dependency):

    python scripts/model_fixtures.py tests/fixtures/models

For each configuration below it builds a small randomly initialized model (seeded), saves it
with `save_pretrained` (config.json and model.safetensors, f32), and records in fixture.json
what transformers computes for fixed prompts: the logits at every position, a greedy
continuation of 32 tokens (with its KV cache), and the gradients of one training step's loss
(cross-entropy over the shifted prompt tokens, summed over the prompts' mean losses) for a few
named parameters.

Then it gives `llama_tiny_gqa` a character-level tokenizer (tokenizer.json, with a
beginning-of-sequence token added to every input as Llama's is) and records in text.json what
transformers makes of a text prompt: its token ids and the text of a greedy continuation.
`--text` does only that, on the saved model; `--only=NAME,NAME` builds only the fixtures named.
"""
import json
import os
import sys

import torch
from transformers import (
    GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
)

PROMPTS = [[3, 17, 42, 5, 60, 11, 9, 33, 2, 48, 71, 14], [88, 1, 23]]
NEW_TOKENS = 32

CONFIGS = {
    "gpt2_tiny": (
        GPT2LMHeadModel,
        GPT2Config(
            vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=None,
            activation_function="gelu_new", layer_norm_epsilon=1e-5, initializer_range=0.2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=96,
        ),
        ["transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.bias", "transformer.wte.weight",
         "transformer.ln_f.weight"],
    ),
    "llama_tiny_gqa": (
        LlamaForCausalLM,
        LlamaConfig(
            vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.2,
            attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2,
        ),
        ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.gate_proj.weight", "lm_head.weight",
         "model.norm.weight"],
    ),
    "llama_tiny_mqa_tied_bias": (
        LlamaForCausalLM,
        LlamaConfig(
            vocab_size=91, hidden_size=64, intermediate_size=80, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128,
            rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.2,
            attention_bias=True, mlp_bias=False, bos_token_id=1, eos_token_id=2,
        ),
        ["model.layers.2.self_attn.q_proj.bias", "model.layers.0.self_attn.o_proj.weight",
         "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight"],
    ),
    # A sliding window shorter than the longer prompt and the continuation.
    "mistral_tiny_window": (
        MistralForCausalLM,
        MistralConfig(
            vocab_size=95, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.2,
            sliding_window=5, bos_token_id=1, eos_token_id=2,
        ),
        ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight",
         "model.layers.0.post_attention_layernorm.weight"],
    ),
}


def main(out_dir, only=None):
    torch.manual_seed(0)
    for name, (cls, config, grad_names) in CONFIGS.items():
        if only and name not in only:
            continue
        torch.manual_seed(1)
        model = cls(config).float().eval()
        # Norm weights away from 1 so a wrong scale shows.
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname or "ln_" in pname:
                    p.add_(torch.randn_like(p) * 0.2)
        path = os.path.join(out_dir, name)
        model.save_pretrained(path, safe_serialization=True)
        fixture = {"prompts": PROMPTS, "logits": [], "greedy": []}
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                fixture["logits"].append(model(ids).logits[0].tolist())
                out = model.generate(
                    ids, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                    eos_token_id=None, pad_token_id=0, min_new_tokens=NEW_TOKENS,
                )
            fixture["greedy"].append(out[0, len(prompt):].tolist())
        model.train()
        model.zero_grad()
        loss = sum(model(torch.tensor([p]), labels=torch.tensor([p])).loss for p in PROMPTS)
        loss.backward()
        params = dict(model.named_parameters())
        fixture["loss"] = float(loss)
        fixture["grads"] = {g: params[g].grad.flatten().tolist() for g in grad_names}
        with open(os.path.join(path, "fixture.json"), "w") as f:
            json.dump(fixture, f)
        print(name, "loss", float(loss))


TEXT_PROMPT = "The cat sat on the mat, née Zoë."
TEXT_NEW_TOKENS = 16


def text_fixture(out_dir):
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    path = os.path.join(out_dir, "llama_tiny_gqa")
    model = LlamaForCausalLM.from_pretrained(path).float().eval()
    # 101 tokens: three special ones, printable ASCII, a newline and two accented letters.
    chars = [chr(c) for c in range(32, 127)] + ["\n", "é", "ë"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({c: 3 + i for i, c in enumerate(chars)})
    assert len(vocab) == model.config.vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.save(os.path.join(path, "tokenizer.json"))
    ids = fast(TEXT_PROMPT).input_ids
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=TEXT_NEW_TOKENS, do_sample=False, use_cache=True,
            eos_token_id=None, pad_token_id=0, min_new_tokens=TEXT_NEW_TOKENS,
        )
    new = out[0, len(ids):].tolist()
    text = {"prompt": TEXT_PROMPT, "ids": ids, "greedy": new, "greedy_text": fast.decode(new, skip_special_tokens=True)}
    with open(os.path.join(path, "text.json"), "w") as f:
        json.dump(text, f, ensure_ascii=False)
    print("llama_tiny_gqa text", text)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else "tests/fixtures/models"
    # `--only NAME,NAME`: build only those fixtures (and not the text one).
    only = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--only=")), None)
    if "--text" not in sys.argv:
        main(out, only)
    if only is None:
        text_fixture(out)
