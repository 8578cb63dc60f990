/*
 * card.c — building model cards from records (see card.h). Records are recognised by their
 * "kind" (validation, bench, calibration); other JSON files are listed under "skipped" with the
 * reason. Benchmarks enter the card only with status "timed" (they passed the gate); refused
 * runs stay visible as device records.
 */
#include "tools/card.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static json_t *get(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    return b ? json_object_get(v, b) : v;
}

static void add_record(json_t *card, json_t *rec, const char *path)
{
    const char *kind = json_string_value(json_object_get(rec, "kind"));
    json_t *dev = json_object_get(json_object_get(card, "device"), "records");
    json_array_append_new(dev, json_pack("{s:s, s:O}", "source", path, "run", rec));
    json_t *ck;
    const char *file;
    json_t *art = json_object_get(card, "artifacts");
    json_object_foreach (json_object_get(rec, "checkpoint_sha256"), file, ck) {
        size_t i;
        json_t *a;
        bool seen = false;
        json_array_foreach (art, i, a)
            seen |= !strcmp(json_string_value(json_object_get(a, "file")), file);
        if (!seen)
            json_array_append_new(art, json_pack("{s:s, s:O}", "file", file, "sha256", ck));
    }
    json_t *prof = json_object_get(rec, "profile");
    const char *pid = json_is_object(prof) ? json_string_value(json_object_get(prof, "id")) : NULL;
    if (!strcmp(kind, "validation")) {
        json_array_append_new(json_object_get(card, "validations"),
                              json_pack("{s:O, s:s?, s:O, s:O, s:O, s:O, s:O, s:s}", "status",
                                        get(rec, "status", NULL), "profile", pid, "reference",
                                        get(rec, "reference", "kind"), "positions_checked",
                                        get(rec, "result", "positions_checked"), "max_logits_error",
                                        get(rec, "result", "max_logits_error"), "max_cache_error",
                                        get(rec, "result", "max_cache_error"), "tolerance",
                                        get(rec, "tolerances", "applied"), "source", path));
    } else if (!strcmp(kind, "bench") &&
               !strcmp(json_string_value(json_object_get(rec, "status")), "timed")) {
        json_t *ttft = get(rec, "ttft_s", NULL), *mem = get(rec, "peak_memory", "host_bytes");
        json_array_append_new(
            json_object_get(card, "benchmarks"),
            json_pack("{s:O, s:O, s:s?, s:O, s:O, s:O, s:O, s:o, s:O, s:o, s:O, s:s}", "device",
                      get(rec, "hardware", "cpu"), "backend", get(rec, "backend", NULL), "profile",
                      pid, "prompt_tokens", get(rec, "workload", "prompt_tokens"), "output_tokens",
                      get(rec, "workload", "output_tokens"), "prefill_tokens_per_s",
                      get(rec, "prefill_tokens_per_s", NULL), "decode_tokens_per_s",
                      get(rec, "decode_tokens_per_s", NULL), "ttft_ms",
                      json_is_number(ttft) ? json_real(json_number_value(ttft) * 1e3) : json_null(),
                      "per_token_ms", get(rec, "per_token_ms", NULL), "peak_mem_mb",
                      json_is_integer(mem) ? json_real((double)json_integer_value(mem) / 1048576.0)
                                           : json_null(),
                      "validation", get(rec, "validation", "status"), "source", path));
    }
    if (!json_object_get(card, "model_record") && json_object_get(rec, "model"))
        json_object_set(card, "model_record", json_object_get(rec, "model"));
}

static json_t *read_pitfalls(const char *path, struct qwenrt_error *err)
{
    json_t *a = json_array();
    if (!path)
        return a;
    FILE *f = fopen(path, "r");
    if (!f) {
        err_set(err, QWENRT_ERR_IO, "%s: cannot read the pitfalls file", path);
        json_decref(a);
        return NULL;
    }
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0])
            json_array_append_new(a, json_string(line));
    }
    fclose(f);
    return a;
}

qwenrt_status card_build(const struct card_params *p, json_t **out, struct qwenrt_error *err)
{
    *out = NULL;
    DIR *d = opendir(p->records_dir);
    if (!d)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot open the records directory", p->records_dir);
    char *names[1024];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".json"))
            names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(names[0]), cmp_str);
    json_t *pit = read_pitfalls(p->pitfalls, err);
    if (!pit) {
        for (int i = 0; i < n; i++)
            xfree(names[i]);
        return err->status;
    }
    json_t *card = json_pack("{s:s, s:[], s:[], s:[], s:{s:[]}, s:o, s:[]}", "schema_version",
                             "qwenrt-card-1", "artifacts", "benchmarks", "validations", "device",
                             "records", "pitfalls", pit, "skipped");
    for (int i = 0; i < n; i++) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", p->records_dir, names[i] ? names[i] : "");
        json_t *rec = names[i] ? json_load_file(path, 0, NULL) : NULL;
        const char *kind = json_string_value(json_object_get(rec, "kind"));
        if (kind &&
            (!strcmp(kind, "validation") || !strcmp(kind, "bench") || !strcmp(kind, "calibration")))
            add_record(card, rec, path);
        else
            json_array_append_new(json_object_get(card, "skipped"),
                                  json_pack("{s:s, s:s}", "source", path, "reason",
                                            rec ? "not a qwenrt record" : "not JSON"));
        json_decref(rec);
        xfree(names[i]);
    }
    json_t *mr = json_object_get(card, "model_record");
    const char *id = p->id ? p->id : json_string_value(json_object_get(mr, "name"));
    const char *arch = json_string_value(json_object_get(mr, "arch"));
    json_object_set_new(card, "model",
                        json_pack("{s:s?, s:s?, s:s?, s:s?, s:s}", "id", id, "family",
                                  arch ? (!strcmp(arch, "qwen35") ? "qwen3.5" : "qwen3") : NULL,
                                  "license", p->license, "source_url", p->source_url, "task",
                                  "text-generation"));
    json_object_set_new(card, "conversion",
                        p->conversion ? json_pack("{s:s, s:O}", "description", p->conversion,
                                                  "format", json_object_get(mr, "format"))
                                      : json_null());
    json_object_del(card, "model_record");
    *out = card;
    return QWENRT_OK;
}

static double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

qwenrt_status card_write_markdown(const json_t *card, const char *path, struct qwenrt_error *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot write the summary", path);
    json_t *m = json_object_get(card, "model");
    fprintf(f, "# %s\n\n", json_string_value(json_object_get(m, "id")) ?: "model");
    fprintf(f, "Family %s, license %s. Generated by `qwenrt card` from %zu records.\n\n",
            json_string_value(json_object_get(m, "family")) ?: "?",
            json_string_value(json_object_get(m, "license")) ?: "unknown",
            json_array_size(json_object_get(json_object_get(card, "device"), "records")));
    size_t i;
    json_t *a;
    fprintf(f, "## Artifacts\n\n| file | sha256 |\n|---|---|\n");
    json_array_foreach (json_object_get(card, "artifacts"), i, a)
        fprintf(f, "| %s | `%s` |\n", json_string_value(json_object_get(a, "file")),
                json_string_value(json_object_get(a, "sha256")));
    fprintf(
        f,
        "\n## Validation\n\n| status | profile | reference | positions | max logits err | tolerance |\n|---|---|---|---|---|---|\n");
    json_array_foreach (json_object_get(card, "validations"), i, a)
        fprintf(f, "| %s | %s | %s | %lld | %.3g | %s |\n",
                json_string_value(json_object_get(a, "status")),
                json_string_value(json_object_get(a, "profile")) ?: "-",
                json_string_value(json_object_get(a, "reference")) ?: "-",
                (long long)json_integer_value(json_object_get(a, "positions_checked")),
                num(a, "max_logits_error"),
                json_string_value(json_object_get(a, "tolerance")) ?: "-");
    fprintf(
        f,
        "\n## Benchmarks (validated paths only)\n\n| device | backend | profile | p / n | prefill tok/s | decode tok/s | TTFT ms |\n|---|---|---|---|---|---|---|\n");
    json_array_foreach (json_object_get(card, "benchmarks"), i, a)
        fprintf(f, "| %s | %s | %s | %lld / %lld | %.1f | %.1f | %.2f |\n",
                json_string_value(json_object_get(a, "device")),
                json_string_value(json_object_get(a, "backend")),
                json_string_value(json_object_get(a, "profile")) ?: "-",
                (long long)json_integer_value(json_object_get(a, "prompt_tokens")),
                (long long)json_integer_value(json_object_get(a, "output_tokens")),
                num(a, "prefill_tokens_per_s"), num(a, "decode_tokens_per_s"), num(a, "ttft_ms"));
    fprintf(f, "\n## Pitfalls\n\n");
    json_array_foreach (json_object_get(card, "pitfalls"), i, a)
        fprintf(f, "- %s\n", json_string_value(a));
    if (!json_array_size(json_object_get(card, "pitfalls")))
        fprintf(f, "(none written)\n");
    if (fclose(f) != 0)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot write the summary", path);
    return QWENRT_OK;
}
