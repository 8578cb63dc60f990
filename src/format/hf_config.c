/*
 * hf_config.c — Hugging Face config.json to model_hparams, for both layouts:
 *   flat (Qwen3: model_type "qwen3", keys at top level) and
 *   multimodal (Qwen3.5: model_type "qwen3_5", the text model under "text_config").
 * RoPE settings come from "rope_parameters" (transformers 5) or "rope_theta" /
 * "partial_rotary_factor" at the top of the text config (older files).
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "model/hparams.h"

/* Reads an integer key into *out; required keys fail with a message naming key and file. */
static qwenrt_status get_int(json_t *obj, const char *key, bool required, int32_t *out,
                             const char *path, struct qwenrt_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: missing key '%s'", path, key);
        return QWENRT_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: key '%s' must be a non-negative integer", path, key);
    *out = (int32_t)json_integer_value(v);
    return QWENRT_OK;
}

static qwenrt_status get_float(json_t *obj, const char *key, float *out, const char *path,
                               struct qwenrt_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return QWENRT_OK;
    if (!json_is_number(v))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: key '%s' must be a number", path, key);
    *out = (float)json_number_value(v);
    return QWENRT_OK;
}

/* eos_token_id may be an integer or a list; the first entry is kept. */
static void get_token_id(json_t *obj, const char *key, int32_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    if (json_is_integer(v))
        *out = (int32_t)json_integer_value(v);
}

static qwenrt_status read_layer_types(struct model_hparams *hp, json_t *tc, const char *path,
                                      struct qwenrt_error *err)
{
    json_t *lt = json_object_get(tc, "layer_types");
    int32_t interval = 4;
    qwenrt_status st = get_int(tc, "full_attention_interval", false, &interval, path, err);
    if (st)
        return st;
    if (hp->n_layer > QR_MAX_LAYERS)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: %d layers (at most %d)", path, hp->n_layer,
                       QR_MAX_LAYERS);
    if (json_is_array(lt) && (int32_t)json_array_size(lt) != hp->n_layer)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: layer_types has %zu entries for %d layers", path,
                       json_array_size(lt), hp->n_layer);
    for (int32_t i = 0; i < hp->n_layer; i++) {
        if (json_is_array(lt)) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (!s || (strcmp(s, "linear_attention") && strcmp(s, "full_attention")))
                return err_set(err, QWENRT_ERR_FORMAT, "%s: layer_types[%d] is not "
                               "\"linear_attention\" or \"full_attention\"", path, i);
            hp->is_recurrent[i] = strcmp(s, "linear_attention") == 0;
        } else {
            if (interval <= 0)
                return err_set(err, QWENRT_ERR_FORMAT, "%s: full_attention_interval must be > 0", path);
            hp->is_recurrent[i] = (i + 1) % interval != 0;
        }
    }
    return QWENRT_OK;
}

static qwenrt_status read_rope(struct model_hparams *hp, json_t *tc, const char *path,
                               struct qwenrt_error *err)
{
    float partial = hp->arch == ARCH_QWEN35 ? 0.25f : 1.0f;
    json_t *rp = json_object_get(tc, "rope_parameters");
    qwenrt_status st = get_float(tc, "rope_theta", &hp->rope_theta, path, err);
    if (!st)
        st = get_float(tc, "partial_rotary_factor", &partial, path, err);
    if (!st && json_is_object(rp)) {
        st = get_float(rp, "rope_theta", &hp->rope_theta, path, err);
        if (!st)
            st = get_float(rp, "partial_rotary_factor", &partial, path, err);
    }
    if (st)
        return st;
    if (!(partial > 0.0f && partial <= 1.0f))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: partial_rotary_factor %g outside (0, 1]", path,
                       (double)partial);
    hp->n_rot = (int32_t)((float)hp->head_dim * partial);
    return QWENRT_OK;
}

static qwenrt_status read_text_config(struct model_hparams *hp, json_t *tc, const char *path,
                                      struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    struct { const char *key; int32_t *dst; bool required; } ints[] = {
        {"vocab_size", &hp->n_vocab, true},
        {"hidden_size", &hp->n_embd, true},
        {"num_hidden_layers", &hp->n_layer, true},
        {"intermediate_size", &hp->n_ff, true},
        {"num_attention_heads", &hp->n_head, true},
        {"num_key_value_heads", &hp->n_head_kv, false},
        {"head_dim", &hp->head_dim, false},
        {"max_position_embeddings", &hp->n_ctx_train, false},
        {"linear_conv_kernel_dim", &hp->ssm_conv, hp->arch == ARCH_QWEN35},
        {"linear_num_key_heads", &hp->ssm_n_k_heads, hp->arch == ARCH_QWEN35},
        {"linear_num_value_heads", &hp->ssm_n_v_heads, hp->arch == ARCH_QWEN35},
        {"linear_key_head_dim", &hp->ssm_k_dim, hp->arch == ARCH_QWEN35},
        {"linear_value_head_dim", &hp->ssm_v_dim, hp->arch == ARCH_QWEN35},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]) && !st; i++)
        st = get_int(tc, ints[i].key, ints[i].required, ints[i].dst, path, err);
    if (st)
        return st;
    if (!hp->n_head_kv)
        hp->n_head_kv = hp->n_head;
    if (!hp->head_dim && hp->n_head)
        hp->head_dim = hp->n_embd / hp->n_head;
    st = get_float(tc, "rms_norm_eps", &hp->rms_eps, path, err);
    if (!st)
        st = read_rope(hp, tc, path, err);
    if (!st && hp->arch == ARCH_QWEN35)
        st = read_layer_types(hp, tc, path, err);
    get_token_id(tc, "bos_token_id", &hp->bos_id);
    get_token_id(tc, "eos_token_id", &hp->eos_id);
    return st;
}

qwenrt_status hparams_from_hf_config(struct model_hparams *hp, const char *json_text,
                                     const char *path, struct qwenrt_error *err)
{
    memset(hp, 0, sizeof(*hp));
    hp->rms_eps = 1e-6f;
    hp->rope_theta = 10000.0f;
    hp->n_ctx_train = 4096;
    hp->bos_id = hp->eos_id = -1;
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return err_set(err, QWENRT_ERR_FORMAT, "%s: not a JSON object (line %d: %s)", path,
                       jerr.line, root ? "wrong type" : jerr.text);
    }
    qwenrt_status st = QWENRT_OK;
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    json_t *tc = root;
    if (!mt) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: missing key 'model_type'", path);
        goto out;
    }
    if (!strcmp(mt, "qwen3")) {
        hp->arch = ARCH_QWEN3;
    } else if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_text")) {
        hp->arch = ARCH_QWEN35;
        hp->attn_gated = true;
        if (json_is_object(json_object_get(root, "text_config")))
            tc = json_object_get(root, "text_config");
    } else {
        st = err_set(err, QWENRT_ERR_UNSUPPORTED,
                     "%s: model_type '%s' is not supported (qwen3, qwen3_5, qwen3_5_text)", path, mt);
        goto out;
    }
    snprintf(hp->name, sizeof(hp->name), "%s", mt);
    st = read_text_config(hp, tc, path, err);
    if (!st && hp->eos_id < 0)
        get_token_id(root, "eos_token_id", &hp->eos_id);
out:
    json_decref(root);
    return st;
}
