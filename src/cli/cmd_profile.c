/*
 * cmd_profile.c — `qwenrt profile list | show ID | check FILE`: runtime profiles (seed 000).
 *
 *   list                 the profiles in the profiles directory: id, intent, stability
 *   show ID [-m MODEL]   the resolved profile (extends chain merged), what each field means
 *                        here, and the kernel every op of each phase is bound to (per op of
 *                        the model with -m, else per op kind), with every remap named
 *   check FILE [-m M]    the same for a file given by path; exit 1 when it does not bind
 *   kernels              the kernel registry: every key, what it needs, whether it runs here,
 *                        and the sha256 of its source (as records carry it)
 * Options: --profiles-dir D, --json (the report as JSON), --ops (list every op).
 */
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "cli/commands.h"
#include "runtime/profile.h"
#include "tools/records.h"
#include "tools/tool_setup.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: qwenrt profile list [--profiles-dir D]\n"
               "       qwenrt profile show ID [-m MODEL] [--json] [--ops] [--profiles-dir D]\n"
               "       qwenrt profile check FILE [-m MODEL] [--json] [--ops] [--profiles-dir D]\n"
               "       qwenrt profile kernels\n");
}

static int list_profiles(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "qwenrt profile: cannot open the profiles directory %s\n", dir);
        return 1;
    }
    struct dirent *e;
    int n = 0;
    printf("%-32s %-12s %-13s %s\n", "id", "intent", "stability", "compatible with");
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json"))
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct profile *p;
        struct qwenrt_error err = {0};
        if (profile_load(path, dir, &p, &err)) {
            printf("%-32s (invalid: %s)\n", e->d_name, err.message);
            continue;
        }
        char compat[64] = "";
        for (unsigned b = 1; b <= PROFILE_INTENT_CALIBRATE; b <<= 1)
            if (p->compatible & b)
                snprintf(compat + strlen(compat), sizeof(compat) - strlen(compat), "%s%s",
                         compat[0] ? "," : "", profile_intent_name(b));
        printf("%-32s %-12s %-13s %s\n", p->id, profile_intent_name(p->intent),
               json_string_value(json_object_get(p->doc, "stability")), compat);
        profile_free(p);
        n++;
    }
    closedir(d);
    return n ? 0 : 1;
}

static void kernel_line(const char *key, const char *what, uint32_t need, uint32_t have)
{
    char feats[96], src[256], dig[65];
    cpu_features_describe(need, feats, sizeof(feats));
    const char *d = records_kernel_digest(key, dig);
    printf("%-28s %-14s %-26s %-4s %.16s  %s\n", key, what, need ? feats : "-",
           (need & have) == need ? "yes" : "no", d ? d : "?",
           records_kernel_source(key, src, sizeof(src)));
}

static int list_kernels(void)
{
    uint32_t have = cpu_features_detect();
    printf("%-28s %-14s %-26s %-4s %-16s  %s\n", "key", "op / dtype", "needs", "here", "sha256",
           "source");
    for (const struct cpu_op_kernel *k = cpu_op_kernels(); k->key; k++)
        kernel_line(k->key, op_kind_name(k->kind), k->cpu_features, have);
    for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++) {
        char what[32];
        snprintf(what, sizeof(what), "matmul %s", dtype_traits(v->wtype)->name);
        kernel_line(v->key, what, v->cpu_features, have);
    }
    return 0;
}

static void print_layers(json_t *layers)
{
    size_t i;
    json_t *v;
    int shown = 0;
    json_int_t prev = -2;
    json_array_foreach (layers, i, v) {
        json_int_t l = json_integer_value(v);
        if (l == prev)
            continue; /* several ops of one layer */
        prev = l;
        if (shown++ == 16) {
            printf(",...");
            break;
        }
        if (l < 0)
            printf("%sglobal", shown > 1 ? "," : "");
        else
            printf("%s%lld", shown > 1 ? "," : "", (long long)l);
    }
}

static void print_text(json_t *r, bool with_model)
{
    printf("profile   %s (%s)\n", json_string_value(json_object_get(r, "id")),
           json_string_value(json_object_get(r, "path")));
    printf("sha256    %s\n", json_string_value(json_object_get(r, "sha256")));
    printf("chain    ");
    size_t i;
    json_t *v;
    json_array_foreach (json_object_get(r, "chain"), i, v)
        printf("%s %s", i ? " ->" : "", json_string_value(v));
    printf("\nintent    %s; compatible with", json_string_value(json_object_get(r, "intent")));
    json_array_foreach (json_object_get(r, "compatibleIntents"), i, v)
        printf(" %s", json_string_value(v));
    json_t *pol = json_object_get(r, "kernelPathPolicy");
    printf("\npolicy    %s, onIncompatible %s\n", json_string_value(json_object_get(pol, "mode")),
           json_string_value(json_object_get(pol, "onIncompatible")));
    printf("\nfields (resolved; applies | recorded | remapped | ignored | informational):\n");
    const char *last_note = "";
    json_array_foreach (json_object_get(r, "fields"), i, v) {
        char *val = json_dumps(json_object_get(v, "value"), JSON_COMPACT | JSON_ENCODE_ANY);
        const char *note = json_string_value(json_object_get(v, "note"));
        printf("  %-13s %s = %.60s%s\n", json_string_value(json_object_get(v, "applies")),
               json_string_value(json_object_get(v, "path")), val ? val : "?",
               val && strlen(val) > 60 ? "..." : "");
        if (strcmp(note, last_note)) /* a run of fields with one note prints it once */
            printf("                %s\n", note);
        last_note = note;
        free(val);
    }
    json_t *b = json_object_get(r, "bindings");
    const char *phases[] = {"prefill", "decode"};
    for (int ph = 0; ph < 2 && b; ph++) {
        printf("\n%s ops -> kernels%s:\n", phases[ph],
               with_model ? "" : " (per op kind; no model given)");
        json_array_foreach (json_object_get(b, phases[ph]), i, v) {
            printf("  %-14s x%-4lld -> %-22s", json_string_value(json_object_get(v, "op")),
                   (long long)json_integer_value(json_object_get(v, "count")),
                   json_string_value(json_object_get(v, "key")));
            const char *rq = json_string_value(json_object_get(v, "requested"));
            if (rq)
                printf(" %s %s",
                       json_is_true(json_object_get(v, "remapped")) ? "remapped from" : "set to",
                       rq);
            printf("  layers ");
            print_layers(json_object_get(v, "layers"));
            printf("\n");
        }
    }
    json_t *remaps = json_object_get(r, "remaps");
    if (remaps) {
        printf("\nremaps (%zu):\n", json_array_size(remaps));
        json_array_foreach (remaps, i, v)
            printf("  %s\n", json_string_value(v));
    }
    json_array_foreach (json_object_get(r, "warnings"), i, v)
        printf("warning: %s\n", json_string_value(v));
}

static int show(const char *id, const char *model, const char *dir, bool as_json, bool ops)
{
    struct qwenrt_error err = {0};
    struct profile *p = NULL;
    struct tool_model tm = {0};
    struct plan vocab[2] = {0};
    const struct plan *plans = vocab;
    struct profile_binding b = {0}, *bp = &b;
    int rc = 1;
    if (tool_load_profile(id, dir, &p, &err))
        goto out;
    if (model) {
        struct tool_open_params op = {.model_path = model,
                                      .profile = id,
                                      .profiles_dir = dir,
                                      .command = "profile show",
                                      .intent = p->intent};
        if (tool_open(&op, &tm, &err))
            goto out;
        plans = tm.model->plans;
        bp = &tm.binding;
    } else if (profile_vocabulary_plans(vocab, &err) ||
               profile_bind(p, vocab, cpu_features_detect(), &b, &err)) {
        goto out;
    }
    json_t *r = profile_report(p, bp, plans);
    if (ops) {
        json_t *all = json_array();
        for (int ph = 0; ph < 2; ph++)
            for (int32_t i = 0; i < bp->n_ops[ph]; i++)
                json_array_append_new(
                    all, json_pack("{s:s, s:i, s:s, s:i, s:s}", "phase", ph ? "decode" : "prefill",
                                   "index", i, "op", op_kind_name(plans[ph].ops[i].kind), "layer",
                                   plans[ph].ops[i].layer, "key", bp->ops[ph][i].key));
        json_object_set_new(r, "ops", all);
    }
    if (as_json) {
        json_dumpf(r, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        printf("\n");
    } else {
        print_text(r, model != NULL);
        if (ops) {
            size_t i;
            json_t *v;
            printf("\nevery op:\n");
            json_array_foreach (json_object_get(r, "ops"), i, v)
                printf("  %-7s %4lld %-14s layer %3lld -> %s\n",
                       json_string_value(json_object_get(v, "phase")),
                       (long long)json_integer_value(json_object_get(v, "index")),
                       json_string_value(json_object_get(v, "op")),
                       (long long)json_integer_value(json_object_get(v, "layer")),
                       json_string_value(json_object_get(v, "key")));
        }
        printf("\nok: the profile resolves and binds%s\n", model ? " to this model" : "");
    }
    json_decref(r);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "qwenrt profile: %s\n", err.message);
    profile_binding_free(&b);
    plan_free(&vocab[0]);
    plan_free(&vocab[1]);
    tool_close(&tm);
    profile_free(p);
    return rc;
}

int cmd_profile(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"profiles-dir", required_argument, 0, 'd'},
        {"json", no_argument, 0, 'j'},        {"ops", no_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *model = NULL, *dir = NULL;
    bool as_json = false, ops = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'd':
            dir = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'o':
            ops = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    const char *sub = argv[optind];
    if (!strcmp(sub, "list"))
        return list_profiles(tool_profiles_dir(dir));
    if (!strcmp(sub, "kernels"))
        return list_kernels();
    if ((!strcmp(sub, "show") || !strcmp(sub, "check")) && optind + 1 < argc)
        return show(argv[optind + 1], model, dir, as_json, ops);
    usage(stderr);
    return 2;
}
