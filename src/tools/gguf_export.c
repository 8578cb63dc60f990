/*
 * gguf_export.c — model geometry + values -> llama.cpp GGUF (see gguf_export.h).
 *
 * Metadata keys and tensor names follow llama.cpp's converter for `qwen3` and `qwen35`
 * (../shared/docs/gguf-and-quant.md). Each tensor is produced by the source as f32, converted
 * to its storage type row by row, and kept until the writer streams the file out.
 */
#include "tools/gguf_export.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"

static const struct {
    const char *name;
    int32_t ftype; /* general.file_type (llama_ftype) */
} type_info[EXPORT_TYPE_COUNT] = {
    [EXPORT_F32] = {"f32", 0},      [EXPORT_F16] = {"f16", 1},       [EXPORT_BF16] = {"bf16", 32},
    [EXPORT_Q8_0] = {"q8_0", 7},    [EXPORT_Q4_0] = {"q4_0", 2},     [EXPORT_Q4_K_M] = {"q4_k_m", 15},
    [EXPORT_Q5_K_M] = {"q5_k_m", 17}, [EXPORT_Q6_K] = {"q6_k", 18},
};

int export_type_from_name(const char *name)
{
    for (int i = 0; i < EXPORT_TYPE_COUNT; i++)
        if (!strcmp(name, type_info[i].name))
            return i;
    return -1;
}

const char *export_type_name(enum export_type t) { return type_info[t].name; }

static void add_spec(struct export_spec *s, int32_t *n, const char *name, int64_t ne0, int64_t ne1,
                     enum export_kind kind, int32_t layer)
{
    struct export_spec *e = &s[(*n)++];
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->ne0 = ne0;
    e->ne1 = ne1;
    e->kind = kind;
    e->layer = layer;
}

#define LAYER_SPEC(suffix, ne0, ne1, kind)                                                       \
    do {                                                                                         \
        snprintf(nm, sizeof(nm), "blk.%d." suffix, l);                                           \
        add_spec(s, &n, nm, (ne0), (ne1), (kind), l);                                            \
    } while (0)

qwenrt_status export_list_tensors(const struct model_hparams *hp, bool tied,
                                  struct export_spec **specs, int32_t *count, struct qwenrt_error *err)
{
    struct export_spec *s = xcalloc((size_t)hp->n_layer * 16 + 3, sizeof(*s));
    if (!s)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    int32_t n = 0;
    char nm[64];
    int64_t E = hp->n_embd, F = hp->n_ff, hd = hp->head_dim;
    int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    add_spec(s, &n, "token_embd.weight", E, hp->n_vocab, EXPORT_EMBED, -1);
    add_spec(s, &n, "output_norm.weight", E, 1, EXPORT_VECTOR, -1);
    if (!tied)
        add_spec(s, &n, "output.weight", E, hp->n_vocab, EXPORT_EMBED, -1);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        LAYER_SPEC("attn_norm.weight", E, 1, EXPORT_VECTOR);
        if (hp->arch == ARCH_QWEN35 && hp->is_recurrent[l]) {
            int64_t C = hparams_ssm_conv_dim(hp), Hv = hp->ssm_n_v_heads, vd = Hv * hp->ssm_v_dim;
            LAYER_SPEC("attn_qkv.weight", E, C, EXPORT_MATRIX);
            LAYER_SPEC("attn_gate.weight", E, vd, EXPORT_MATRIX);
            LAYER_SPEC("ssm_conv1d.weight", hp->ssm_conv, C, EXPORT_CONV);
            LAYER_SPEC("ssm_dt.bias", Hv, 1, EXPORT_VECTOR);
            LAYER_SPEC("ssm_a", Hv, 1, EXPORT_VECTOR);
            LAYER_SPEC("ssm_beta.weight", E, Hv, EXPORT_MATRIX);
            LAYER_SPEC("ssm_alpha.weight", E, Hv, EXPORT_MATRIX);
            LAYER_SPEC("ssm_norm.weight", hp->ssm_v_dim, 1, EXPORT_VECTOR);
            LAYER_SPEC("ssm_out.weight", vd, E, EXPORT_MATRIX);
        } else {
            LAYER_SPEC("attn_q.weight", E, qd * (hp->attn_gated ? 2 : 1), EXPORT_MATRIX);
            LAYER_SPEC("attn_k.weight", E, kvd, EXPORT_MATRIX);
            LAYER_SPEC("attn_v.weight", E, kvd, EXPORT_MATRIX);
            LAYER_SPEC("attn_output.weight", qd, E, EXPORT_MATRIX);
            LAYER_SPEC("attn_q_norm.weight", hd, 1, EXPORT_VECTOR);
            LAYER_SPEC("attn_k_norm.weight", hd, 1, EXPORT_VECTOR);
        }
        if (hp->arch == ARCH_QWEN35)
            LAYER_SPEC("post_attention_norm.weight", E, 1, EXPORT_VECTOR);
        else
            LAYER_SPEC("ffn_norm.weight", E, 1, EXPORT_VECTOR);
        LAYER_SPEC("ffn_gate.weight", E, F, EXPORT_MATRIX);
        LAYER_SPEC("ffn_up.weight", E, F, EXPORT_MATRIX);
        LAYER_SPEC("ffn_down.weight", F, E, EXPORT_MATRIX);
    }
    *specs = s;
    *count = n;
    return QWENRT_OK;
}

/* llama.cpp's "use more bits" layers for attn_v / ffn_down in _M mixtures: the first and
 * last eighth of the layers, and every third layer in between. */
static bool use_more_bits(int32_t layer, int32_t n_layer)
{
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* A type whose block fits rows of ne0 elements: the wanted one, else Q8_0, else F16. */
static enum qr_dtype fit_block(enum qr_dtype want, int64_t ne0)
{
    const struct qr_dtype_traits *tr = dtype_traits(want);
    if (ne0 % tr->block_size == 0)
        return want;
    return ne0 % 32 == 0 ? QR_Q8_0 : QR_F16;
}

enum qr_dtype export_tensor_dtype(const struct model_hparams *hp, enum export_type t,
                                  const struct export_spec *spec)
{
    if (spec->kind == EXPORT_VECTOR || spec->kind == EXPORT_CONV)
        return QR_F32;
    static const enum qr_dtype plain[EXPORT_TYPE_COUNT] = {
        [EXPORT_F32] = QR_F32, [EXPORT_F16] = QR_F16, [EXPORT_BF16] = QR_BF16,
        [EXPORT_Q8_0] = QR_Q8_0, [EXPORT_Q4_0] = QR_Q4_0, [EXPORT_Q6_K] = QR_Q6_K,
        [EXPORT_Q4_K_M] = QR_Q4_K, [EXPORT_Q5_K_M] = QR_Q5_K,
    };
    enum qr_dtype d = plain[t];
    if (t == EXPORT_Q4_K_M || t == EXPORT_Q5_K_M) {
        bool more = strstr(spec->name, "attn_v.weight") || strstr(spec->name, "ffn_down.weight");
        if (spec->kind == EXPORT_EMBED || (more && use_more_bits(spec->layer, hp->n_layer)))
            d = QR_Q6_K;
    }
    return fit_block(d, spec->ne0);
}

static qwenrt_status write_hparams(struct gguf_writer *w, const struct model_hparams *hp,
                                   const struct export_params *p)
{
    const char *a = hp->arch == ARCH_QWEN35 ? "qwen35" : "qwen3";
    char k[128];
    qwenrt_status st = gguf_writer_set_str(w, "general.architecture", a);
#define U32(suffix, v) if (!st) { snprintf(k, sizeof(k), "%s." suffix, a); st = gguf_writer_set_u32(w, k, (uint32_t)(v)); }
#define F32(suffix, v) if (!st) { snprintf(k, sizeof(k), "%s." suffix, a); st = gguf_writer_set_f32(w, k, (v)); }
    if (!st) st = gguf_writer_set_str(w, "general.type", "model");
    if (!st) st = gguf_writer_set_str(w, "general.name", p->name ? p->name : hp->name);
    if (!st) st = gguf_writer_set_u32(w, "general.file_type", (uint32_t)type_info[p->type].ftype);
    if (!st) st = gguf_writer_set_u32(w, "general.quantization_version", 2);
    U32("block_count", hp->n_layer);
    U32("context_length", hp->n_ctx_train);
    U32("embedding_length", hp->n_embd);
    U32("feed_forward_length", hp->n_ff);
    U32("attention.head_count", hp->n_head);
    U32("attention.head_count_kv", hp->n_head_kv);
    U32("attention.key_length", hp->head_dim);
    U32("attention.value_length", hp->head_dim);
    F32("rope.freq_base", hp->rope_theta);
    F32("attention.layer_norm_rms_epsilon", hp->rms_eps);
    if (hp->arch == ARCH_QWEN35) {
        int32_t sections[4] = {11, 11, 10, 0};
        U32("rope.dimension_count", hp->n_rot);
        if (!st) { snprintf(k, sizeof(k), "%s.rope.dimension_sections", a); st = gguf_writer_set_arr_i32(w, k, sections, 4); }
        U32("ssm.conv_kernel", hp->ssm_conv);
        U32("ssm.state_size", hp->ssm_k_dim);
        U32("ssm.group_count", hp->ssm_n_k_heads);
        U32("ssm.time_step_rank", hp->ssm_n_v_heads);
        U32("ssm.inner_size", hp->ssm_n_v_heads * hp->ssm_v_dim);
        int32_t interval = 0; /* write the interval when the layer pattern follows one */
        for (int32_t l = 0; l < hp->n_layer && !interval; l++)
            if (!hp->is_recurrent[l])
                interval = l + 1;
        U32("full_attention_interval", interval ? interval : hp->n_layer);
        bool rec[QR_MAX_LAYERS];
        for (int32_t l = 0; l < hp->n_layer; l++)
            rec[l] = hp->is_recurrent[l];
        if (!st) { snprintf(k, sizeof(k), "%s.attention.recurrent_layers", a); st = gguf_writer_set_arr_bool(w, k, rec, (uint64_t)hp->n_layer); }
    }
#undef U32
#undef F32
    return st;
}

static qwenrt_status write_tokenizer(struct gguf_writer *w, const struct export_params *p,
                                     int32_t n_vocab, struct qwenrt_error *err)
{
    struct tokenizer *tok = NULL;
    qwenrt_status st = QWENRT_OK;
    if (p->tokenizer_json)
        st = tokenizer_load_json(&tok, p->tokenizer_json, err);
    else if (p->tokenizer_gguf && gguf_find_kv(p->tokenizer_gguf, "tokenizer.ggml.tokens"))
        st = tokenizer_load_gguf(&tok, p->tokenizer_gguf, err);
    if (!st && tok && tokenizer_n_vocab(tok) > n_vocab)
        st = err_set(err, QWENRT_ERR_SHAPE, "the tokenizer has %d tokens, more than the model's %d embedding rows",
                     tokenizer_n_vocab(tok), n_vocab);
    if (!st && tok)
        st = tokenizer_write_gguf_kv(tok, w, n_vocab, err);
    tokenizer_free(tok);
    return st;
}

struct progress_state {
    bool on;
    int32_t done, total;
};

static void on_progress(void *user, const char *name, uint64_t done, uint64_t total)
{
    struct progress_state *ps = user;
    ps->done++;
    if (!ps->on)
        return;
    int width = 30, filled = total ? (int)((double)done / (double)total * width) : width;
    fprintf(stderr, "\r[%.*s%*s] %5.1f%% %4d/%d %8.1f/%.1f MiB  %-36.36s", filled,
            "##############################", width - filled, "", total ? 100.0 * (double)done / (double)total : 100.0,
            ps->done, ps->total, (double)done / 1048576.0, (double)total / 1048576.0, name);
    if (ps->done == ps->total)
        fputc('\n', stderr);
}

/* Asks the source for one tensor and stores it as dtype in a new buffer (*out). */
static qwenrt_status build_tensor(const struct export_spec *spec, enum qr_dtype dtype,
                                  export_source_fn source, void *user, void **out,
                                  struct qwenrt_error *err)
{
    size_t row_bytes;
    if (!dtype_row_bytes(dtype, spec->ne0, &row_bytes))
        return err_set(err, QWENRT_ERR_SHAPE, "tensor '%s': rows of %lld do not fit %s blocks", spec->name,
                       (long long)spec->ne0, dtype_traits(dtype)->name);
    float *f = xmalloc((size_t)(spec->ne0 * spec->ne1), sizeof(float));
    uint8_t *q = xmalloc((size_t)spec->ne1, row_bytes);
    qwenrt_status st = QWENRT_OK;
    if (!f || !q) {
        st = err_set(err, QWENRT_ERR_NOMEM, "tensor '%s': out of memory", spec->name);
        goto out;
    }
    st = source(user, spec, f, err);
    /* rows are independent: quantised in parallel, the bytes do not depend on the threads */
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(| : bad) if (!st && spec->ne1 >= 256)
    for (int64_t r = 0; r < spec->ne1; r++)
        if (!st && !quant_quantize_row(dtype, f + r * spec->ne0, q + (size_t)r * row_bytes, spec->ne0))
            bad |= 1;
    if (!st && bad)
        st = err_set(err, QWENRT_ERR_UNSUPPORTED, "tensor '%s': cannot quantise to %s", spec->name,
                     dtype_traits(dtype)->name);
out:
    xfree(f);
    if (st) {
        xfree(q);
        return st;
    }
    *out = q;
    return QWENRT_OK;
}

qwenrt_status export_gguf(const char *path, const struct model_hparams *hp,
                          const struct export_params *params, export_source_fn source, void *user,
                          struct qwenrt_error *err)
{
    struct export_spec *specs = NULL;
    void **data = NULL;
    int32_t n = 0;
    struct gguf_writer *w = NULL;
    qwenrt_status st = export_list_tensors(hp, params->tied, &specs, &n, err);
    if (!st)
        st = gguf_writer_init(&w, err);
    if (!st && !(data = xcalloc((size_t)n, sizeof(*data))))
        st = err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    if (!st && write_hparams(w, hp, params))
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: cannot add metadata", path);
    if (!st)
        st = write_tokenizer(w, params, hp->n_vocab, err);
    for (int32_t i = 0; i < n && !st; i++) {
        enum qr_dtype dt = export_tensor_dtype(hp, params->type, &specs[i]);
        st = build_tensor(&specs[i], dt, source, user, &data[i], err);
        int64_t ne[2] = {specs[i].ne0, specs[i].ne1};
        if (!st)
            st = gguf_writer_add_tensor(w, specs[i].name, dt, specs[i].ne1 > 1 || specs[i].kind != EXPORT_VECTOR ? 2 : 1, ne, data[i]);
    }
    struct progress_state ps = {.on = params->progress, .total = n};
    if (!st)
        st = gguf_writer_write(w, path, on_progress, &ps, err);
    gguf_writer_free(w);
    for (int32_t i = 0; data && i < n; i++)
        xfree(data[i]);
    xfree(data);
    xfree(specs);
    return st;
}
