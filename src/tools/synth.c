/*
 * synth.c — random weights with the statistics of a trained model's shapes (see synth.h).
 *
 * Each tensor's values come from a splitmix64 stream seeded by (seed, FNV hash of its name):
 * matrices uniform with standard deviation 1/sqrt(row length) (activations keep their scale
 * through the layers), norm weights 1 ± 0.1, DeltaNet ssm_a = -exp(A_log) with A_log in
 * [0, ln 16), dt_bias in [-1, 1), conv taps in [-0.5, 0.5).
 */
#include "tools/synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static const char *const presets[] = {"qwen3-0.6b", "qwen35-0.8b", "qwen3-tiny", "qwen35-tiny", NULL};

const char *const *synth_preset_names(void) { return presets; }

static void base_qwen3(struct model_hparams *hp)
{
    memset(hp, 0, sizeof(*hp));
    hp->arch = ARCH_QWEN3;
    hp->rms_eps = 1e-6f;
    hp->bos_id = hp->eos_id = -1;
}

qwenrt_status synth_preset(const char *arch, struct model_hparams *hp, struct qwenrt_error *err)
{
    base_qwen3(hp);
    if (!strcmp(arch, "qwen3-0.6b") || !strcmp(arch, "qwen3-tiny")) {
        bool tiny = arch[6] == 't';
        hp->n_vocab = tiny ? 1024 : 151936;
        hp->n_embd = tiny ? 128 : 1024;
        hp->n_layer = tiny ? 3 : 28;
        hp->n_ff = tiny ? 384 : 3072;
        hp->n_head = tiny ? 4 : 16;
        hp->n_head_kv = tiny ? 2 : 8;
        hp->head_dim = tiny ? 64 : 128;
        hp->n_rot = hp->head_dim;
        hp->rope_theta = 1e6f;
        hp->n_ctx_train = tiny ? 4096 : 40960;
    } else if (!strcmp(arch, "qwen35-0.8b") || !strcmp(arch, "qwen35-tiny")) {
        bool tiny = arch[7] == 't';
        hp->arch = ARCH_QWEN35;
        hp->attn_gated = true;
        hp->n_vocab = tiny ? 1024 : 248320;
        hp->n_embd = tiny ? 128 : 1024;
        hp->n_layer = tiny ? 8 : 24;
        hp->n_ff = tiny ? 256 : 3584;
        hp->n_head = tiny ? 4 : 8;
        hp->n_head_kv = 2;
        hp->head_dim = tiny ? 64 : 256;
        hp->n_rot = hp->head_dim / 4;
        hp->rope_theta = 1e7f;
        hp->n_ctx_train = tiny ? 4096 : 262144;
        hp->ssm_conv = 4;
        hp->ssm_n_k_heads = tiny ? 2 : 16;
        hp->ssm_n_v_heads = tiny ? 4 : 16;
        hp->ssm_k_dim = tiny ? 32 : 128;
        hp->ssm_v_dim = tiny ? 48 : 128;
        for (int32_t l = 0; l < hp->n_layer; l++)
            hp->is_recurrent[l] = (l + 1) % 4 != 0;
    } else {
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "unknown --arch '%s' (qwen3-0.6b, qwen35-0.8b, qwen3-tiny, qwen35-tiny)", arch);
    }
    snprintf(hp->name, sizeof(hp->name), "synth-%s", arch);
    return QWENRT_OK;
}

struct rng {
    uint64_t s;
};

static uint64_t next_u64(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float next_sym(struct rng *r) { return (float)((double)(next_u64(r) >> 11) * 0x1.0p-52 - 1.0); }

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

struct synth_source {
    uint64_t seed;
};

static qwenrt_status synth_values(void *user, const struct export_spec *spec, float *dst,
                                  struct qwenrt_error *err)
{
    const struct synth_source *src = user;
    struct rng r = {src->seed ^ fnv1a(spec->name)};
    int64_t n = spec->ne0 * spec->ne1;
    float scale = (float)(sqrt(3.0) / sqrt((double)spec->ne0)); /* uniform: std = scale/sqrt(3) */
    if (strstr(spec->name, "ssm_a")) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = -expf(logf(16.0f) * 0.5f * (next_sym(&r) + 1.0f));
    } else if (strstr(spec->name, "ssm_dt")) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = next_sym(&r);
    } else if (spec->kind == EXPORT_VECTOR) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = 1.0f + 0.1f * next_sym(&r);
    } else if (spec->kind == EXPORT_CONV) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = 0.5f * next_sym(&r);
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = scale * next_sym(&r);
    }
    (void)err;
    return QWENRT_OK;
}

qwenrt_status synth_write(const char *path, const struct model_hparams *hp, uint64_t seed,
                          const struct export_params *params, struct qwenrt_error *err)
{
    struct synth_source src = {seed};
    return export_gguf(path, hp, params, synth_values, &src, err);
}
