/*
 * cmd_generate.c — `qwenrt generate -m MODEL --ids 1,2,3 -n 16`: prefill the ids, then greedy
 * decoding of n tokens; prints the new ids comma-separated on one line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

int cmd_generate(int argc, char **argv)
{
    struct cli_model_opts o = {.command = "generate"};
    const char *ids_s = NULL, *v;
    long n_gen = 16;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&o, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r)
            continue;
        if (!strcmp(argv[i], "--ids") && (ids_s = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(argv[i], "-n") && (v = cli_value(argc, argv, &i)) &&
            cli_parse_int("-n", v, 0, 1 << 20, &n_gen))
            continue;
        fprintf(stderr, "usage: qwenrt generate -m MODEL --ids 1,2,3 [-n 16] [--threads N]\n");
        return 2;
    }
    int32_t *ids = NULL, n = 0;
    if (!ids_s) {
        fprintf(stderr, "usage: qwenrt generate -m MODEL --ids 1,2,3 [-n 16] [--threads N]\n");
        return 2;
    }
    if (!cli_parse_ids(ids_s, &ids, &n))
        return 2;
    int rc = 1;
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = cli_load_model(&o);
    struct qwenrt_session *s = m ? cli_new_session(m, &o) : NULL;
    struct qwenrt_model_info info;
    struct qwenrt_sampler *greedy = NULL;
    struct qwenrt_sampler_params sp = qwenrt_sampler_default_params(); /* temperature 0 */
    if (!s)
        goto out;
    qwenrt_model_get_info(m, &info);
    if (qwenrt_sampler_init(&sp, info.n_vocab, &greedy, &err) != QWENRT_OK ||
        qwenrt_session_prefill(s, ids, n, NULL, &err) != QWENRT_OK)
        goto fail;
    for (long g = 0; g < n_gen; g++) {
        int32_t next;
        if (qwenrt_session_sample(s, greedy, &next, &err) != QWENRT_OK)
            goto fail;
        printf(g ? ",%d" : "%d", next);
        fflush(stdout);
        if (g + 1 < n_gen && qwenrt_session_decode(s, next, &err) != QWENRT_OK)
            goto fail;
    }
    printf("\n");
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "\nqwenrt: %s\n", err.message);
out:
    free(ids);
    qwenrt_sampler_free(greedy);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
    return rc;
}
