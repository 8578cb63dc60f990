/*
 * cmd_info.c — `qwenrt info -m MODEL`: architecture, geometry, tensor count, dtypes, bytes,
 * and the sha256 of every model file.
 */
#include <stdio.h>
#include <string.h>

#include "base/sha256.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "model/model.h"

/* Counts tensors and bytes per dtype over every tensor in the model's files. */
static void print_tensors(const struct qwenrt_model *m)
{
    int64_t count[256] = {0}, bytes[256] = {0}, total = 0;
    for (int32_t f = 0; f < (m->format == MODEL_FORMAT_GGUF ? 1 : m->n_shards); f++) {
        const struct qr_tensor *ts = m->format == MODEL_FORMAT_GGUF ? m->gguf.tensors : m->shards[f].tensors;
        int64_t n = m->format == MODEL_FORMAT_GGUF ? m->gguf.n_tensors : m->shards[f].n_tensors;
        for (int64_t i = 0; i < n; i++) {
            int d = ts[i].dtype & 0xff;
            count[d]++;
            bytes[d] += (int64_t)ts[i].nbytes;
            total++;
        }
    }
    printf("tensors        %lld\n", (long long)total);
    for (int d = 0; d < 256; d++)
        if (count[d])
            printf("  %-12s %lld tensors, %.2f MiB\n", dtype_traits(d) ? dtype_traits(d)->name : "?",
                   (long long)count[d], (double)bytes[d] / 1048576.0);
}

static int print_hashes(const struct qwenrt_model *m)
{
    struct qwenrt_error err = {0};
    char hex[SHA256_HEX_LEN];
    int n = m->format == MODEL_FORMAT_GGUF ? 1 : m->n_shards;
    for (int i = 0; i < n; i++) {
        const char *p = m->format == MODEL_FORMAT_GGUF ? m->gguf.map.path : m->shards[i].map.path;
        if (sha256_file_hex(p, hex, &err) != QWENRT_OK) {
            fprintf(stderr, "qwenrt: %s\n", err.message);
            return 1;
        }
        printf("sha256         %s  %s\n", hex, p);
    }
    return 0;
}

int cmd_info(int argc, char **argv)
{
    struct cli_model_opts o = {0};
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&o, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r == 0) {
            fprintf(stderr, "usage: qwenrt info -m MODEL\n");
            return 2;
        }
    }
    struct qwenrt_model *m = cli_load_model(&o);
    if (!m)
        return 1;
    const struct model_hparams *hp = &m->hp;
    printf("model          %s (%s)\n", m->path, m->format == MODEL_FORMAT_GGUF ? "gguf" : "hugging face directory");
    printf("architecture   %s\nname           %s\n", arch_name(hp->arch), hp->name);
    printf("vocab          %d\nhidden         %d\nlayers         %d\nffn            %d\n", hp->n_vocab,
           hp->n_embd, hp->n_layer, hp->n_ff);
    printf("attention      %d heads, %d kv heads, head_dim %d, rope dims %d, theta %g%s\n", hp->n_head,
           hp->n_head_kv, hp->head_dim, hp->n_rot, (double)hp->rope_theta, hp->attn_gated ? ", output gate" : "");
    if (hp->arch == ARCH_QWEN35) {
        int rec = 0;
        for (int32_t l = 0; l < hp->n_layer; l++)
            rec += hp->is_recurrent[l];
        printf("deltanet       %d of %d layers, %d key heads x %d, %d value heads x %d, conv %d\n", rec,
               hp->n_layer, hp->ssm_n_k_heads, hp->ssm_k_dim, hp->ssm_n_v_heads, hp->ssm_v_dim, hp->ssm_conv);
    }
    printf("context        %d (trained)\n", hp->n_ctx_train);
    printf("lm head        %s\n", m->w.output == m->w.tok_embd ? "tied to the embedding" : "separate");
    printf("parameters     %lld\nweight bytes   %lld (%.1f MiB)\n", (long long)m->n_params,
           (long long)m->weight_bytes, (double)m->weight_bytes / 1048576.0);
    print_tensors(m);
    int rc = print_hashes(m);
    qwenrt_model_free(m);
    return rc;
}
