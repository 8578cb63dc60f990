/*
 * cmd_logits.c — `qwenrt logits -m MODEL --ids 1,2,3 --out FILE`: one batched prefill, the
 * logits after every position written as a safetensors file with one F32 tensor `logits`
 * of shape [number of ids, vocab].
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "format/safetensors.h"

int cmd_logits(int argc, char **argv)
{
    struct cli_model_opts o = {0};
    const char *ids_s = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&o, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r)
            continue;
        if (!strcmp(argv[i], "--ids") && (ids_s = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(argv[i], "--out") && (out = cli_value(argc, argv, &i)))
            continue;
        fprintf(stderr, "usage: qwenrt logits -m MODEL --ids 1,2,3 --out FILE [--threads N]\n");
        return 2;
    }
    if (!ids_s || !out) {
        fprintf(stderr, "usage: qwenrt logits -m MODEL --ids 1,2,3 --out FILE [--threads N]\n");
        return 2;
    }
    int32_t *ids = NULL, n = 0;
    if (!cli_parse_ids(ids_s, &ids, &n))
        return 2;
    int rc = 1;
    struct qwenrt_model *m = cli_load_model(&o);
    struct qwenrt_session *s = m ? cli_new_session(m, &o) : NULL;
    struct qwenrt_model_info info;
    float *logits = NULL;
    struct qwenrt_error err = {0};
    if (!s)
        goto out;
    qwenrt_model_get_info(m, &info);
    logits = malloc((size_t)n * (size_t)info.n_vocab * sizeof(float));
    if (!logits) {
        fprintf(stderr, "qwenrt: out of memory for %d x %d logits\n", n, info.n_vocab);
        goto out;
    }
    if (qwenrt_session_prefill(s, ids, n, logits, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        goto out;
    }
    struct safetensors_out t = {"logits", QR_F32, 2, {n, info.n_vocab}, logits};
    if (safetensors_write(out, &t, 1, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        goto out;
    }
    rc = 0;
out:
    free(logits);
    free(ids);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
    return rc;
}
