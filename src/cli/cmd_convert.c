/*
 * cmd_convert.c — `qwenrt convert MODEL -o out.gguf --type f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k`:
 * a Hugging Face directory or GGUF file to a llama.cpp GGUF, with a progress bar; the output
 * appears only when complete (written to out.gguf.tmp, then renamed).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tools/convert.h"

static int usage(void)
{
    fprintf(stderr, "usage: qwenrt convert MODEL -o OUT.gguf --type f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k\n"
                    "                      [--tokenizer tokenizer.json] [--name NAME]\n");
    return 2;
}

int cmd_convert(int argc, char **argv)
{
    struct cli_model_opts o = {0};
    const char *out = NULL, *type = NULL, *tok = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&o, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r)
            continue;
        const char *a = argv[i];
        if (!strcmp(a, "-o") && (out = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--type") && (type = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--tokenizer") && (tok = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--name") && (name = cli_value(argc, argv, &i)))
            continue;
        if (a[0] != '-' && !o.model) {
            o.model = a;
            continue;
        }
        return usage();
    }
    if (!o.model || !out || !type)
        return usage();
    int t = export_type_from_name(type);
    if (t < 0) {
        fprintf(stderr, "qwenrt: unknown --type '%s'\n", type);
        return 2;
    }
    struct qwenrt_model *m = cli_load_model(&o);
    if (!m)
        return 1;
    struct export_params p = {.type = (enum export_type)t, .tokenizer_json = tok, .name = name,
                              .progress = isatty(2)};
    struct qwenrt_error err = {0};
    int rc = 0;
    if (convert_model(m, out, &p, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        rc = 1;
    } else {
        fprintf(stderr, "wrote %s (%s)\n", out, type);
    }
    qwenrt_model_free(m);
    return rc;
}
