/*
 * convert.c — model -> GGUF (see convert.h).
 *
 * Values come from the loaded model, which already holds llama.cpp's conventions for its small
 * vectors (Qwen3.5 norms as 1+w, ssm_a = -exp(A_log); model.h). The one reordering left is the
 * DeltaNet value heads: HF files group them by key head (value head j uses key head j / r),
 * llama.cpp tiles them (position p uses key head p % Hk), so when Hk != Hv every tensor indexed
 * by value head is permuted: tiled position p = i*Hk + kh takes grouped head j = kh*r + i.
 */
#include "tools/convert.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"
#include "model/model.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"

/* Permutes, in each of `reps` runs of `stride` floats, the Hv blocks of `block` floats that
 * start `offset` floats into the run, from grouped to tiled value-head order. */
static qwenrt_status permute_v_heads(float *data, int64_t reps, int64_t stride, int64_t offset,
                                     int64_t block, int32_t Hk, int32_t Hv, struct qwenrt_error *err)
{
    int32_t r = Hv / Hk;
    float *tmp = xmalloc((size_t)(Hv * block), sizeof(float));
    if (!tmp)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    for (int64_t rep = 0; rep < reps; rep++) {
        float *base = data + rep * stride + offset;
        memcpy(tmp, base, (size_t)(Hv * block) * sizeof(float));
        for (int32_t p = 0; p < Hv; p++) {
            int32_t i = p / Hk, kh = p % Hk, j = kh * r + i;
            memcpy(base + p * block, tmp + j * block, (size_t)block * sizeof(float));
        }
    }
    xfree(tmp);
    return QWENRT_OK;
}

/* The bound f32 vector for a 1-D / conv spec, by its llama.cpp suffix. */
static const float *bound_vector(const struct qwenrt_model *m, const struct export_spec *s)
{
    if (s->layer < 0)
        return !strcmp(s->name, "output_norm.weight") ? m->w.output_norm : NULL;
    const struct layer_weights *L = &m->w.layers[s->layer];
    const char *suf = strchr(s->name + 4, '.') + 1;
    static const char *const names[] = {"attn_norm.weight", "ffn_norm.weight", "post_attention_norm.weight",
                                        "attn_q_norm.weight", "attn_k_norm.weight", "ssm_conv1d.weight",
                                        "ssm_dt.bias", "ssm_a", "ssm_norm.weight"};
    const float *vals[] = {L->attn_norm, L->ffn_norm, L->ffn_norm, L->q_norm, L->k_norm,
                           L->ssm_conv, L->ssm_dt, L->ssm_a, L->ssm_norm};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(suf, names[i]))
            return vals[i];
    return NULL;
}

static qwenrt_status read_matrix(const struct qwenrt_model *m, const struct export_spec *s, float *dst,
                                 struct qwenrt_error *err)
{
    const struct qr_tensor *t = model_find_tensor(m, s->name);
    if (!t && !strcmp(s->name, "output.weight"))
        t = m->w.output;
    if (!t)
        return err_set(err, QWENRT_ERR_NOT_FOUND, "%s: no tensor for '%s'", m->path, s->name);
    size_t row_bytes = t->nbytes / (size_t)tensor_nrows(t);
    for (int64_t r = 0; r < s->ne1; r++)
        if (!quant_dequantize_row(t->dtype, (const uint8_t *)t->data + (size_t)r * row_bytes, dst + r * s->ne0, s->ne0))
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: cannot read '%s'", m->path, s->name);
    return QWENRT_OK;
}

/* Grouped -> tiled value-head order for the DeltaNet tensors of an HF Qwen3.5 with Hk != Hv. */
static qwenrt_status tile_v_heads(const struct qwenrt_model *m, const struct export_spec *s, float *d,
                                  struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    int32_t Hk = hp->ssm_n_k_heads, Hv = hp->ssm_n_v_heads, dv = hp->ssm_v_dim;
    int64_t vstart = 2LL * Hk * hp->ssm_k_dim; /* first V channel of q|k|v */
    const char *suf = strchr(s->name + 4, '.') + 1;
    if (!strcmp(suf, "attn_qkv.weight"))
        return permute_v_heads(d, 1, 0, vstart * s->ne0, dv * s->ne0, Hk, Hv, err);
    if (!strcmp(suf, "ssm_conv1d.weight"))
        return permute_v_heads(d, 1, 0, vstart * s->ne0, dv * s->ne0, Hk, Hv, err);
    if (!strcmp(suf, "attn_gate.weight"))
        return permute_v_heads(d, 1, 0, 0, dv * s->ne0, Hk, Hv, err);
    if (!strcmp(suf, "ssm_beta.weight") || !strcmp(suf, "ssm_alpha.weight"))
        return permute_v_heads(d, 1, 0, 0, s->ne0, Hk, Hv, err);
    if (!strcmp(suf, "ssm_dt.bias") || !strcmp(suf, "ssm_a"))
        return permute_v_heads(d, 1, 0, 0, 1, Hk, Hv, err);
    if (!strcmp(suf, "ssm_out.weight"))
        return permute_v_heads(d, s->ne1, s->ne0, 0, dv, Hk, Hv, err);
    return QWENRT_OK;
}

static qwenrt_status model_values(void *user, const struct export_spec *s, float *dst,
                                  struct qwenrt_error *err)
{
    const struct qwenrt_model *m = user;
    qwenrt_status st = QWENRT_OK;
    if (s->kind == EXPORT_VECTOR || s->kind == EXPORT_CONV) {
        const float *v = bound_vector(m, s);
        if (!v)
            return err_set(err, QWENRT_ERR_INTERNAL, "convert: no value for '%s'", s->name);
        memcpy(dst, v, (size_t)(s->ne0 * s->ne1) * sizeof(float));
    } else {
        st = read_matrix(m, s, dst, err);
    }
    const struct model_hparams *hp = &m->hp;
    if (!st && hp->arch == ARCH_QWEN35 && !m->v_head_tiled && hp->ssm_n_k_heads != hp->ssm_n_v_heads &&
        s->layer >= 0 && hp->is_recurrent[s->layer])
        st = tile_v_heads(m, s, dst, err);
    return st;
}

qwenrt_status convert_model(const struct qwenrt_model *m, const char *out_path,
                            struct export_params *params, struct qwenrt_error *err)
{
    char *tok_json = NULL;
    struct stat sb;
    if (!params->tokenizer_json && !params->tokenizer_gguf) {
        if (m->format == MODEL_FORMAT_GGUF)
            params->tokenizer_gguf = &m->gguf;
        else if (tokenizer_find_json(m->path, &tok_json, NULL) == QWENRT_OK && stat(tok_json, &sb) == 0)
            params->tokenizer_json = tok_json;
    }
    params->tied = m->w.output == m->w.tok_embd;
    if (!params->name)
        params->name = m->hp.name;
    qwenrt_status st = export_gguf(out_path, &m->hp, params, model_values, (void *)m, err);
    if (tok_json && params->tokenizer_json == tok_json)
        params->tokenizer_json = NULL;
    xfree(tok_json);
    return st;
}
