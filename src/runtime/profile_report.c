/*
 * profile_report.c — what a resolved profile means here, as JSON (see profile_report in
 * profile.h): each field under runtime with whether it applies to qwenrt, is only recorded, is
 * remapped or is ignored, and the binding of every op of each phase, grouped by op kind and key.
 * `qwenrt profile show|check` prints this; records embed the compact parts.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/profile.h"

struct field_rule {
    const char *prefix; /* path prefix under the profile root */
    const char *applies;
    const char *note;
};

static const char cadence_note[] =
    "decode cadence: validated and recorded in records; the CPU backend decodes one token per "
    "step with no device submission or readback, so it changes nothing there";

static const struct field_rule rules[] = {
    {"runtime.inference.executionPatch.addKernels", "applies",
     "kernel aliases; see bindings and remaps"},
    {"runtime.inference.executionPatch.set", "applies",
     "rebinds ops to kernels; see bindings and remaps"},
    {"runtime.inference.kernelPathPolicy", "applies",
     "decides whether kernels that cannot run here fail or are remapped"},
    {"runtime.inference.cudaTuning", "applies",
     "the CUDA decode's GEMV shapes, PDL launch order and attention splits (CUDA sessions; "
     "written by qwenrt calibrate --backend cuda); the CPU backend ignores it"},
    {"runtime.inference.batching.maxTokens", "ignored",
     "Doppler's mirror of the batch cap; qwenrt reads maxBatchDecodeTokens"},
    {"runtime.inference.batching", "recorded", cadence_note},
    {"runtime.inference.session.decodeLoop", "recorded", cadence_note},
    {"runtime.inference.session.lmHeadArgmaxQ4K", "ignored",
     "workgroup tuning of Doppler's Q4K LM-head+argmax WGSL kernel; qwenrt has no such fused kernel"},
    {"runtime.inference.sampling", "ignored",
     "validate and bench decode greedily; run takes sampling from its flags"},
    {"runtime", "ignored", "not a qwenrt setting"},
    {"model", "informational", "qwenrt binds to the model given with -m; this id is not checked"},
    {"extends", "applies", "resolved into the chain"},
    {"", "applies", "profile metadata"},
};

static json_t *fusion_for(const struct profile_binding *b, const char *path)
{
    const char *pre = "runtime.inference.session.";
    if (!b || strncmp(path, pre, strlen(pre)))
        return NULL;
    size_t i;
    json_t *f;
    json_array_foreach (b->fusions, i, f)
        if (!strcmp(json_string_value(json_object_get(f, "flag")), path + strlen(pre)))
            return f;
    return NULL;
}

static void add_field(json_t *fields, const struct profile_binding *b, const char *path, json_t *v)
{
    json_t *f = fusion_for(b, path);
    if (f) {
        const char *eff = json_string_value(json_object_get(f, "effect"));
        json_array_append_new(
            fields, json_pack("{s:s, s:O, s:s, s:s}", "path", path, "value", v, "applies",
                              !strncmp(eff, "remapped", 8) ? "remapped" : "applies", "note", eff));
        return;
    }
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        if (!strncmp(path, rules[i].prefix, strlen(rules[i].prefix))) {
            json_array_append_new(fields,
                                  json_pack("{s:s, s:O, s:s, s:s}", "path", path, "value", v,
                                            "applies", rules[i].applies, "note", rules[i].note));
            return;
        }
}

/* Leaves of the resolved profile (arrays are leaves). */
static void walk(json_t *fields, const struct profile_binding *b, const char *path, json_t *v)
{
    if (!json_is_object(v) || json_object_size(v) == 0) {
        add_field(fields, b, path, v);
        return;
    }
    const char *key;
    json_t *sub;
    json_object_foreach (v, key, sub) {
        char p[512];
        snprintf(p, sizeof(p), "%s%s%s", path, path[0] ? "." : "", key);
        walk(fields, b, p, sub);
    }
}

/* Ops of one phase grouped by (op, key, requested, remapped), with their layers. */
static json_t *group_phase(const struct profile_binding *b, const struct plan *pl, int ph)
{
    json_t *groups = json_array();
    for (int32_t i = 0; i < pl->n_ops && i < b->n_ops[ph]; i++) {
        const struct profile_op_binding *ob = &b->ops[ph][i];
        const char *op = op_kind_name(pl->ops[i].kind);
        json_t *g = NULL, *e;
        size_t j;
        json_array_foreach (groups, j, e) {
            const char *rq = json_string_value(json_object_get(e, "requested"));
            if (!strcmp(json_string_value(json_object_get(e, "op")), op) &&
                !strcmp(json_string_value(json_object_get(e, "key")), ob->key) &&
                ((!rq && !ob->requested) || (rq && ob->requested && !strcmp(rq, ob->requested)))) {
                g = e;
                break;
            }
        }
        if (!g) {
            g = json_pack("{s:s, s:s, s:s?, s:b, s:[], s:i}", "op", op, "key", ob->key, "requested",
                          ob->requested, "remapped", ob->remapped, "layers", "count", 0);
            json_array_append_new(groups, g);
        }
        json_array_append_new(json_object_get(g, "layers"), json_integer(pl->ops[i].layer));
        json_object_set_new(g, "count",
                            json_integer(json_integer_value(json_object_get(g, "count")) + 1));
    }
    return groups;
}

json_t *profile_report(const struct profile *p, const struct profile_binding *b,
                       const struct plan plans[2])
{
    json_t *r = json_object();
    json_t *chain = json_array(), *compat = json_array(), *fields = json_array();
    for (int i = 0; i < p->n_chain; i++)
        json_array_append_new(chain, json_string(p->chain[i]));
    for (unsigned bit = 1; bit <= PROFILE_INTENT_CALIBRATE; bit <<= 1)
        if (p->compatible & bit)
            json_array_append_new(compat, json_string(profile_intent_name(bit)));
    walk(fields, b, "", p->doc);
    json_object_set_new(r, "id", json_string(p->id));
    json_object_set_new(r, "path", json_string(p->path));
    json_object_set_new(r, "sha256", json_string(p->sha256));
    json_object_set_new(r, "chain", chain);
    json_object_set_new(r, "intent", json_string(profile_intent_name(p->intent)));
    json_object_set_new(r, "compatibleIntents", compat);
    json_object_set_new(r, "kernelPathPolicy",
                        json_pack("{s:s, s:s, s:b}", "mode",
                                  p->capability_aware ? "capability-aware" : "locked",
                                  "onIncompatible", p->remap ? "remap" : "error", "remapInScope",
                                  p->remap_in_scope));
    json_object_set_new(r, "resolved", json_deep_copy(p->doc));
    json_object_set_new(r, "fields", fields);
    json_object_set_new(r, "warnings", json_deep_copy(p->warnings));
    if (b && plans) {
        json_object_set_new(r, "bindings",
                            json_pack("{s:o, s:o}", "prefill", group_phase(b, &plans[0], 0),
                                      "decode", group_phase(b, &plans[1], 1)));
        json_object_set_new(r, "remaps", json_deep_copy(b->remaps));
        json_object_set_new(r, "fusions", json_deep_copy(b->fusions));
    }
    return r;
}
