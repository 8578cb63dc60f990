/*
 * names.c — the one table of tensor names: llama.cpp (GGUF) spelling, which qwenrt uses
 * internally, against the Hugging Face spelling of each architecture.
 *
 * Per-layer names are "blk.N.<gguf suffix>" and "<prefix>layers.N.<hf suffix>"; the prefix is
 * "model." for Qwen3 and "model.language_model." for Qwen3.5. Value conventions that differ
 * between the formats (Qwen3.5 norms stored +1, ssm_a = -exp(A_log)) are handled in qwen35.c.
 */
#include <stdio.h>
#include <string.h>

#include "model/model.h"

static const struct {
    const char *gguf;
    const char *hf;
} layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},           /* qwen3 */
    {"post_attention_norm.weight", "post_attention_layernorm.weight"}, /* qwen35 */
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},
    {"attn_gate.weight", "linear_attn.in_proj_z.weight"},
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight"},
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight"},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"},
    {"ssm_dt.bias", "linear_attn.dt_bias"},
    {"ssm_a", "linear_attn.A_log"}, /* value differs: ssm_a = -exp(A_log) */
    {"ssm_norm.weight", "linear_attn.norm.weight"},
    {"ssm_out.weight", "linear_attn.out_proj.weight"},
};

static const struct {
    const char *gguf;
    const char *hf; /* after the prefix, except lm_head */
    bool prefixed;
} global_names[] = {
    {"token_embd.weight", "embed_tokens.weight", true},
    {"output_norm.weight", "norm.weight", true},
    {"output.weight", "lm_head.weight", false},
};

bool names_gguf_to_hf(enum qr_arch arch, const char *gguf_name, char *out, size_t out_len)
{
    const char *prefix = arch == ARCH_QWEN35 ? "model.language_model." : "model.";
    for (size_t i = 0; i < sizeof(global_names) / sizeof(global_names[0]); i++)
        if (!strcmp(gguf_name, global_names[i].gguf))
            return (size_t)snprintf(out, out_len, "%s%s", global_names[i].prefixed ? prefix : "",
                                    global_names[i].hf) < out_len;
    int layer, used = 0;
    if (sscanf(gguf_name, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0)
        return false;
    const char *suffix = gguf_name + used;
    for (size_t i = 0; i < sizeof(layer_names) / sizeof(layer_names[0]); i++)
        if (!strcmp(suffix, layer_names[i].gguf))
            return (size_t)snprintf(out, out_len, "%slayers.%d.%s", prefix, layer,
                                    layer_names[i].hf) < out_len;
    return false;
}
