#!/usr/bin/env python3
"""make_seeds.py — writes the micro models that seed the GGUF, safetensors and config fuzzers.

Usage: tests/fuzz/make_seeds.py QWENRT_BIN OUT_DIR
Writes OUT_DIR/{qwen3,qwen35}-micro/ (config.json, model.safetensors, tokenizer.json: random f32
weights with the exact tensor names and shapes qwenrt expects, hidden size 32, one or two layers,
a 259-token byte-level tokenizer) and converts each to OUT_DIR/*.gguf (f32, q8_0 and q4_0) with
`qwenrt convert`. The q8_0 and q4_0 GGUF files (q4_0: what a load for the CUDA backend converts), configs and tokenizer were copied by hand into
tests/fuzz/corpus/ (fuzz_gguf, fuzz_config, fuzz_tokenizer_json) and committed, so this only
needs to run again when the formats change. Only the Python standard library is used.
"""
import json, os, random, struct, subprocess, sys

H, V, F = 32, 260, 32  # hidden, vocab (covers the tokenizer's 259 ids), MLP


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        data = struct.pack("<%df" % n, *[random.uniform(-0.1, 0.1) for _ in range(n)])
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


def bytelevel_char(b):
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        return chr(b)
    n = sum(1 for c in range(b) if not (33 <= c <= 126 or 161 <= c <= 172 or 174 <= c <= 255))
    return chr(256 + n)


def write_tokenizer(path):
    vocab = {bytelevel_char(b): b for b in range(256)}
    vocab.update({"ab": 256, "abc": 257})
    tok = {
        "added_tokens": [{"id": 258, "content": "<|im_end|>", "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex":
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
                "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "model": {"type": "BPE", "vocab": vocab, "merges": ["a b", ["ab", "c"]]},
    }
    with open(path, "w") as f:
        json.dump(tok, f)


def qwen3(d):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V,
           "hidden_size": H, "intermediate_size": F, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": True,
           "max_position_embeddings": 256, "eos_token_id": 258, "torch_dtype": "float32"}
    p = "model.layers.0."
    t = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H]),
         (p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H]),
         (p + "self_attn.q_proj.weight", [32, H]), (p + "self_attn.k_proj.weight", [16, H]),
         (p + "self_attn.v_proj.weight", [16, H]), (p + "self_attn.o_proj.weight", [H, 32]),
         (p + "self_attn.q_norm.weight", [16]), (p + "self_attn.k_norm.weight", [16]),
         (p + "mlp.gate_proj.weight", [F, H]), (p + "mlp.up_proj.weight", [F, H]),
         (p + "mlp.down_proj.weight", [H, F])]
    return cfg, t


def qwen35(d):
    tc = {"model_type": "qwen3_5_text", "vocab_size": V, "hidden_size": H,
          "intermediate_size": F, "num_hidden_layers": 2, "num_attention_heads": 2,
          "num_key_value_heads": 1, "head_dim": 16,
          "layer_types": ["linear_attention", "full_attention"], "full_attention_interval": 2,
          "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
          "attn_output_gate": True, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
          "max_position_embeddings": 256, "eos_token_id": 258, "dtype": "float32",
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                              "partial_rotary_factor": 0.25}}
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "tie_word_embeddings": True, "text_config": tc}
    m = "model.language_model."
    conv = 2 * 16 + 2 * 16
    l0, l1 = m + "layers.0.", m + "layers.1."
    t = [(m + "embed_tokens.weight", [V, H]), (m + "norm.weight", [H])]
    for p in (l0, l1):
        t += [(p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H]),
              (p + "mlp.gate_proj.weight", [F, H]), (p + "mlp.up_proj.weight", [F, H]),
              (p + "mlp.down_proj.weight", [H, F])]
    t += [(l0 + "linear_attn.A_log", [2]), (l0 + "linear_attn.conv1d.weight", [conv, 1, 4]),
          (l0 + "linear_attn.dt_bias", [2]), (l0 + "linear_attn.in_proj_a.weight", [2, H]),
          (l0 + "linear_attn.in_proj_b.weight", [2, H]),
          (l0 + "linear_attn.in_proj_qkv.weight", [conv, H]),
          (l0 + "linear_attn.in_proj_z.weight", [32, H]), (l0 + "linear_attn.norm.weight", [16]),
          (l0 + "linear_attn.out_proj.weight", [H, 32])]
    t += [(l1 + "self_attn.q_proj.weight", [64, H]), (l1 + "self_attn.k_proj.weight", [16, H]),
          (l1 + "self_attn.v_proj.weight", [16, H]), (l1 + "self_attn.o_proj.weight", [H, 32]),
          (l1 + "self_attn.q_norm.weight", [16]), (l1 + "self_attn.k_norm.weight", [16])]
    return cfg, t


def main():
    qwenrt, out = sys.argv[1], sys.argv[2]
    random.seed(9)
    for name, fn in (("qwen3-micro", qwen3), ("qwen35-micro", qwen35)):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        cfg, tensors = fn(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        write_tokenizer(os.path.join(d, "tokenizer.json"))
        for ty in ("f32", "q8_0", "q4_0"):
            subprocess.run([qwenrt, "convert", d, "-o", os.path.join(out, f"{name}-{ty}.gguf"),
                            "--type", ty], check=True)


if __name__ == "__main__":
    main()
