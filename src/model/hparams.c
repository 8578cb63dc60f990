/*
 * hparams.c — hyper-parameters from GGUF metadata (llama.cpp's keys, see
 * ../shared/docs/gguf-and-quant.md) and the consistency checks shared by both loaders.
 */
#include "model/hparams.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"

const char *arch_name(enum qr_arch arch) { return arch == ARCH_QWEN35 ? "qwen35" : "qwen3"; }

/* Reads "<arch>.<suffix>" as an integer into *out; required keys fail with a message. */
static qwenrt_status gguf_arch_int(const struct gguf_file *gf, const char *arch, const char *suffix,
                                   bool required, int32_t *out, struct qwenrt_error *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int64_t v;
    if (!gguf_get_int(gf, key, &v)) {
        if (required)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: missing or non-integer key '%s'", gf->map.path, key);
        return QWENRT_OK;
    }
    if (v < 0 || v > INT32_MAX)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: key '%s' = %lld out of range", gf->map.path, key,
                       (long long)v);
    *out = (int32_t)v;
    return QWENRT_OK;
}

static void gguf_arch_float(const struct gguf_file *gf, const char *arch, const char *suffix, float *out)
{
    char key[128];
    double v;
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    if (gguf_get_float(gf, key, &v))
        *out = (float)v;
}

static qwenrt_status gguf_recurrent_layers(struct model_hparams *hp, const struct gguf_file *gf,
                                           struct qwenrt_error *err)
{
    int32_t interval = 4;
    qwenrt_status st = gguf_arch_int(gf, "qwen35", "full_attention_interval", false, &interval, err);
    if (st)
        return st;
    const struct gguf_value *arr = gguf_get_array(gf, "qwen35.attention.recurrent_layers");
    for (int32_t i = 0; i < hp->n_layer; i++) {
        if (arr && arr->v.arr.count == (uint64_t)hp->n_layer)
            hp->is_recurrent[i] = arr->v.arr.items[i].v.u64 != 0;
        else if (interval > 0)
            hp->is_recurrent[i] = (i + 1) % interval != 0;
        else
            return err_set(err, QWENRT_ERR_FORMAT, "%s: full_attention_interval must be > 0", gf->map.path);
    }
    return QWENRT_OK;
}

qwenrt_status hparams_from_gguf(struct model_hparams *hp, const struct gguf_file *gf,
                                struct qwenrt_error *err)
{
    memset(hp, 0, sizeof(*hp));
    hp->rms_eps = 1e-6f;
    hp->rope_theta = 10000.0f;
    hp->bos_id = hp->eos_id = -1;
    const char *arch = gguf_get_string(gf, "general.architecture");
    if (!arch)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: missing key 'general.architecture'", gf->map.path);
    if (!strcmp(arch, "qwen3")) {
        hp->arch = ARCH_QWEN3;
    } else if (!strcmp(arch, "qwen35")) {
        hp->arch = ARCH_QWEN35;
        hp->attn_gated = true;
    } else {
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "%s: architecture '%s' is not supported (qwen3, qwen35)", gf->map.path, arch);
    }
    const char *name = gguf_get_string(gf, "general.name");
    snprintf(hp->name, sizeof(hp->name), "%s", name ? name : arch);
    bool r = hp->arch == ARCH_QWEN35;
    struct { const char *suffix; int32_t *dst; bool required; } ints[] = {
        {"block_count", &hp->n_layer, true},
        {"embedding_length", &hp->n_embd, true},
        {"feed_forward_length", &hp->n_ff, true},
        {"context_length", &hp->n_ctx_train, false},
        {"attention.head_count", &hp->n_head, true},
        {"attention.head_count_kv", &hp->n_head_kv, false},
        {"attention.key_length", &hp->head_dim, false},
        {"rope.dimension_count", &hp->n_rot, false},
        {"ssm.conv_kernel", &hp->ssm_conv, r},
        {"ssm.state_size", &hp->ssm_k_dim, r},
        {"ssm.group_count", &hp->ssm_n_k_heads, r},
        {"ssm.time_step_rank", &hp->ssm_n_v_heads, r},
    };
    qwenrt_status st = QWENRT_OK;
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]) && !st; i++)
        st = gguf_arch_int(gf, arch, ints[i].suffix, ints[i].required, ints[i].dst, err);
    if (st)
        return st;
    if (r) {
        int32_t inner = 0;
        st = gguf_arch_int(gf, arch, "ssm.inner_size", true, &inner, err);
        if (st)
            return st;
        hp->ssm_v_dim = hp->ssm_n_v_heads ? inner / hp->ssm_n_v_heads : 0;
    }
    if (!hp->n_head_kv)
        hp->n_head_kv = hp->n_head;
    if (!hp->head_dim && hp->n_head)
        hp->head_dim = hp->n_embd / hp->n_head;
    if (!hp->n_rot)
        hp->n_rot = hp->head_dim;
    gguf_arch_float(gf, arch, "rope.freq_base", &hp->rope_theta);
    gguf_arch_float(gf, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    int64_t v;
    if (gguf_get_int(gf, "tokenizer.ggml.bos_token_id", &v))
        hp->bos_id = (int32_t)v;
    if (gguf_get_int(gf, "tokenizer.ggml.eos_token_id", &v))
        hp->eos_id = (int32_t)v;
    if (hp->n_layer > QR_MAX_LAYERS)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: %d layers (at most %d)", gf->map.path,
                       hp->n_layer, QR_MAX_LAYERS);
    return r ? gguf_recurrent_layers(hp, gf, err) : QWENRT_OK;
}

qwenrt_status hparams_validate(const struct model_hparams *hp, const char *path,
                               struct qwenrt_error *err)
{
    if (hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 ||
        hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: sizes must be positive (vocab %d, hidden %d, layers %d, ffn %d, heads %d/%d, head_dim %d)",
                       path, hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head,
                       hp->n_head_kv, hp->head_dim);
    if (hp->n_layer > QR_MAX_LAYERS || hp->n_embd > 65536 || hp->head_dim > 1024 ||
        hp->n_head > 1024 || hp->n_ff > (1 << 20))
        return err_set(err, QWENRT_ERR_LIMIT, "%s: geometry beyond qwenrt's limits", path);
    if (hp->n_head % hp->n_head_kv != 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: %d query heads not a multiple of %d kv heads",
                       path, hp->n_head, hp->n_head_kv);
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: rotary dims %d invalid for head_dim %d", path,
                       hp->n_rot, hp->head_dim);
    if (hp->arch == ARCH_QWEN35) {
        if (hp->ssm_conv < 1 || hp->ssm_conv > 16 || hp->ssm_n_k_heads <= 0 ||
            hp->ssm_n_v_heads <= 0 || hp->ssm_k_dim <= 0 || hp->ssm_v_dim <= 0 ||
            hp->ssm_k_dim > 1024 || hp->ssm_v_dim > 1024)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: invalid DeltaNet geometry", path);
        if (hp->ssm_n_v_heads % hp->ssm_n_k_heads != 0)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: %d DeltaNet value heads not a multiple of %d key heads",
                           path, hp->ssm_n_v_heads, hp->ssm_n_k_heads);
    }
    return QWENRT_OK;
}
