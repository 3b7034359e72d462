#!/usr/bin/env python3
"""Makes tests/data/models/qwen3_moe_v512, qwen2_v512, mistral_v512, phi3_v512, gemma3_v512, glm4_moe_v512 and
deepseek_v3_v512: the tiny Qwen3-MoE, Qwen2, Mistral, Phi-3, Gemma 3, GLM-4 MoE and DeepSeek-V3 test models
(tests/data/models/qwen3_moe, qwen2, mistral, phi3, gemma3, glm4_moe, deepseek_v3:
random weights from transformers) cut to the first 512 rows of their embedding and LM head (qwen2's and gemma3's
heads are the tied embedding), so that they speak stories260K's 512-token llama2.c tokenizer (BOS 1, EOS 2 in all:
gemma3's own 2 / 1 are swapped to them).
`miles check` and `miles run` need text for prompts and rewards; this gives the MoE path (R3 capture
and replay), the Qwen2 family, Mistral's sliding window Phi-3's fused projections and Gemma 3's
mixed sliding / full layers models they
can run end to end. Needs only numpy + safetensors (the light venv).

    python3 scripts/make_moe_check_model.py [--data-dir tests/data]

tests/reference/check_hf_goldens.sh runs it on the freshly regenerated goldens too, so the derived
model stays equal to what transformers' qwen3_moe gives today.
"""
import argparse
import json
import os
import shutil

from safetensors.numpy import load_file, save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="tests/data")
    args = ap.parse_args()
    for src_name in ("qwen3_moe", "qwen2", "mistral", "phi3", "gemma3", "glm4_moe", "deepseek_v3"):
        cut_vocab(args.data_dir, src_name)


def cut_vocab(data_dir, src_name):
    SRC = os.path.join(data_dir, "models", src_name)
    DST = os.path.join(data_dir, "models", src_name + "_v512")
    w = load_file(os.path.join(SRC, "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in w:
            w[name] = w[name][:512].copy()
    os.makedirs(DST, exist_ok=True)
    save_file(w, os.path.join(DST, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(SRC, "config.json")) as f:
        config = json.load(f)
    config["vocab_size"] = 512
    tokens = {"bos_token_id": 1, "eos_token_id": 2}
    config.update(tokens)
    with open(os.path.join(DST, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(SRC, "generation_config.json")) as f:
        generation = json.load(f)
    generation.update((k, v) for k, v in tokens.items() if k in generation)
    with open(os.path.join(DST, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
        f.write("\n")

if __name__ == "__main__":
    main()
