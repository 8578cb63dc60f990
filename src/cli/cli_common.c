/*
 * cli_common.c — shared option handling for the sub-commands (see cli_common.h).
 */
#include "cli/cli_common.h"
#include "runtime/profile.h"
#include "tools/tool_setup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cli_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "qwenrt: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "qwenrt: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_int_arg(const char *opt, const char *s, int lo, int hi, int *out)
{
    long v;
    if (!cli_parse_int(opt, s, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

bool cli_parse_u64(const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "qwenrt: %s expects a non-negative integer, got '%s'\n", opt, s);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

int cli_parse_model_opt(struct cli_model_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        o->model = v;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!(v = cli_value(argc, argv, i)) || !cli_parse_int(a, v, 0, 1024, &n))
            return -1;
        o->threads = (int)n;
    } else if (!strcmp(a, "--backend")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
            fprintf(stderr, "qwenrt: --backend must be cpu or cuda, got '%s'\n", v);
            return -1;
        }
        o->backend = v;
    } else if (!strcmp(a, "--profile")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        o->profile = v;
    } else if (!strcmp(a, "--precision")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "default") && strcmp(v, "exact")) {
            fprintf(stderr, "qwenrt: --precision must be default or exact, got '%s'\n", v);
            return -1;
        }
        o->precision = strcmp(v, "exact") ? QWENRT_PRECISION_DEFAULT : QWENRT_PRECISION_EXACT;
    } else if (!strcmp(a, "--kv-type")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "default") && strcmp(v, "f32") && strcmp(v, "f16")) {
            fprintf(stderr, "qwenrt: --kv-type must be default, f32 or f16, got '%s'\n", v);
            return -1;
        }
        o->kv_type = !strcmp(v, "f16") ? QWENRT_KV_F16 : !strcmp(v, "f32") ? QWENRT_KV_F32 : QWENRT_KV_DEFAULT;
    } else if (!strcmp(a, "--keep-layer-types")) {
        o->keep_layer_types = true;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!(v = cli_value(argc, argv, i)) || !cli_parse_int(a, v, 1, 1 << 22, &n))
            return -1;
        o->ctx = (int32_t)n;
    } else {
        return 0;
    }
    return 1;
}

bool cli_parse_ids(const char *s, int32_t **ids, int32_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *out = malloc(cap * sizeof(*out));
    int32_t count = 0;
    const char *p = s;
    while (out && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "qwenrt: --ids expects comma-separated non-negative integers, got '%s'\n", s);
            free(out);
            return false;
        }
        out[count++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!out || count == 0) {
        fprintf(stderr, "qwenrt: --ids is empty\n");
        free(out);
        return false;
    }
    *ids = out;
    *n = count;
    return true;
}

/* Says on stderr when the backend computes with converted copies of some weights (more
 * memory than the file; qwenrt_model_info.n_converted). */
static void note_converted(const struct qwenrt_model *m, const char *backend)
{
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    if (info.n_converted > 0)
        fprintf(stderr,
                "qwenrt: %d weight matrices converted for the %s backend, whose kernels lack their "
                "type (exactly to Q8_0 / Q6_K where the type allows, else to F16, with the other "
                "block-quantised layer matrices beside them unless --keep-layer-types): %.2f GiB of "
                "weights\n",
                info.n_converted, backend, (double)info.weight_bytes / (1 << 30));
}

struct qwenrt_model *cli_load_model(const struct cli_model_opts *o)
{
    if (!o->model) {
        fprintf(stderr, "qwenrt: no model given (-m FILE.gguf or -m HF_DIR)\n");
        return NULL;
    }
    struct qwenrt_error err = {0};
    if (o->profile) {
        struct tool_open_params tp = {.model_path = o->model, .backend = o->backend,
                                      .n_threads = o->threads, .profile = o->profile,
                                      .command = o->command ? o->command : "this command",
                                      .intent = PROFILE_INTENT_INVESTIGATE,
                                      .keep_layer_types = o->keep_layer_types};
        struct tool_model t;
        if (tool_open(&tp, &t, &err) != QWENRT_OK) {
            fprintf(stderr, "qwenrt: %s\n", err.message);
            return NULL;
        }
        struct qwenrt_model *m = t.model; /* the binding lives in the model's plans */
        t.model = NULL;
        tool_close(&t);
        note_converted(m, o->backend ? o->backend : "cpu");
        return m;
    }
    struct qwenrt_model_params p = qwenrt_model_default_params();
    p.n_threads = o->threads;
    p.keep_layer_types = o->keep_layer_types;
    if (o->backend)
        p.backend = o->backend;
    struct qwenrt_model *m = NULL;
    if (qwenrt_model_load(o->model, &p, &m, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        return NULL;
    }
    note_converted(m, p.backend);
    return m;
}

struct qwenrt_session *cli_new_session(struct qwenrt_model *m, const struct cli_model_opts *o)
{
    struct qwenrt_session_params p = qwenrt_session_default_params();
    p.n_threads = o->threads;
    p.n_ctx = o->ctx;
    p.precision = o->precision;
    p.kv_type = o->kv_type;
    struct qwenrt_session *s = NULL;
    struct qwenrt_error err = {0};
    if (qwenrt_session_init(m, &p, &s, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        return NULL;
    }
    return s;
}

int cli_run_opt(const struct cli_run_opts *o, int c, const char *arg)
{
    switch (c) {
    case 'm': return o->model ? (*o->model = arg, 1) : 0;
    case 'b': return o->backend ? (*o->backend = arg, 1) : 0;
    case 'P': return o->profile ? (*o->profile = arg, 1) : 0;
    case 'd': return o->profiles_dir ? (*o->profiles_dir = arg, 1) : 0;
    case 'p': return !o->n_prompt ? 0 : cli_parse_int_arg("-p", arg, 1, 1 << 20, o->n_prompt) ? 1 : -1;
    case 'n': return !o->n_gen ? 0 : cli_parse_int_arg("-n", arg, 0, 1 << 20, o->n_gen) ? 1 : -1;
    case 't': return !o->n_threads ? 0 : cli_parse_int_arg("--threads", arg, 0, 1024, o->n_threads) ? 1 : -1;
    case 'w': return !o->warmup ? 0 : cli_parse_int_arg("--warmup", arg, 0, 10000, o->warmup) ? 1 : -1;
    case 'r': return !o->trials ? 0 : cli_parse_int_arg("--trials", arg, 1, 10000, o->trials) ? 1 : -1;
    case 's': return !o->seed ? 0 : cli_parse_u64("--seed", arg, o->seed) ? 1 : -1;
    default: return 0;
    }
}
