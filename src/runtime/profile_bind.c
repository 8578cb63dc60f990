/*
 * profile_bind.c — binding plan ops to kernel keys under a profile, and describing the result
 * (see profile.h).
 *
 * Every op first gets its default key (what cpu_bind_plan would pick on this CPU, and for
 * matmul the best matmul.<dtype>.<impl> for its weight). Then each executionPatch.set entry
 * rewrites the ops whose op key and section match. A requested key is an addKernels alias or a
 * registry key; an alias whose kernel is not a registry key (a WGSL or CUDA file of another
 * runtime) cannot run here. Kernels that cannot run (foreign, missing CPU features, another
 * weight dtype) are remapped to the default key only under kernelPathPolicy capability-aware +
 * remap with the execution graph in scope; otherwise binding fails. A kernel of another op
 * kind is always an error: that is a mistake in the profile, not a capability question.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "base/alloc.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "runtime/profile.h"

/* ------------------------------------------------------------------ registry lookups */

static const struct cpu_op_kernel *op_kernel_by_key(const char *key)
{
    for (const struct cpu_op_kernel *k = cpu_op_kernels(); k->key; k++)
        if (!strcmp(k->key, key))
            return k;
    return NULL;
}

static const struct cpu_matmul_variant *matmul_by_key(const char *key)
{
    for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++)
        if (!strcmp(v->key, key))
            return v;
    return NULL;
}

static bool is_registry_key(const char *key)
{
    return op_kernel_by_key(key) || matmul_by_key(key);
}

static const char *default_key(const struct plan_op *op, uint32_t features)
{
    if (op->kind == OP_MATMUL && op->w) {
        const struct cpu_matmul_variant *v = cpu_matmul_pick(op->w->dtype, features, NULL);
        if (v)
            return v->key;
    }
    const struct cpu_op_kernel *k = cpu_op_pick(op->kind, features, NULL);
    return k ? k->key : NULL;
}

/* ------------------------------------------------------------------ fusions (seed 000 flags) */

struct fusion_def {
    const char *flag;   /* path under runtime.inference.session */
    const char *fusion; /* qwenrt fused op key, or NULL when qwenrt's layout always has it */
    const char *ops;    /* what it fuses, in qwenrt ops */
};

static const struct fusion_def fusion_defs[] = {
    {"usePostFfnNextInputRMSNormPairFusion", "add_rmsnorm",
     "add (layer N post-FFN residual) + rmsnorm (layer N+1 input norm)"},
    {"useGreedyLmHeadArgmaxFusion", "logits_argmax", "logits + greedy argmax"},
    {"attentionDecodeOnline.useOutputGateFusion", "attention_gate", "attention + sigmoid_gate"},
    {"attentionDecodeOnline.useDirectContiguousKVLayout", NULL,
     "KV cache layout: qwenrt's cache is always contiguous, position-major"},
    {"useFusedQKVSplitQKNormRoPE", "qk_norm_rope",
     "q/k RMSNorm + RoPE (one qk_norm_rope op in qwenrt; q, k, v come from separate matmuls)"},
    {"useLinearAttentionABProjectionFusion", "matmul_ab", "the in_proj_a and in_proj_b matmuls"},
    {"useLinearAttentionQKVZProjectionFusion", "matmul_qkvz",
     "the in_proj_qkv and in_proj_z matmuls"},
    {"useLinearAttentionFusedDecodeCore", "gdn_conv_core", "gdn_conv + gdn_core"},
};

static bool fused_op_registered(const char *name)
{
    for (const struct cpu_op_kernel *k = cpu_op_kernels(); k->key; k++)
        if (!strcmp(op_kind_name(k->kind), name))
            return true;
    return false;
}

static json_t *session_flag(const struct profile *p, const char *flag)
{
    json_t *o = json_object_get(json_object_get(json_object_get(p->doc, "runtime"), "inference"),
                                "session");
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", flag);
    char *dot = strchr(buf, '.');
    if (dot) {
        *dot = 0;
        o = json_object_get(o, buf);
        return json_object_get(o, dot + 1);
    }
    return json_object_get(o, buf);
}

static qwenrt_status bind_fusions(const struct profile *p, struct profile_binding *b,
                                  struct qwenrt_error *err)
{
    for (size_t i = 0; i < sizeof(fusion_defs) / sizeof(fusion_defs[0]); i++) {
        const struct fusion_def *f = &fusion_defs[i];
        json_t *v = session_flag(p, f->flag);
        if (!v)
            continue;
        if (!json_is_boolean(v))
            return err_set(err, QWENRT_ERR_FORMAT, "%s: session.%s must be true or false", p->path,
                           f->flag);
        bool want = json_is_true(v);
        bool builtin = !f->fusion || !strcmp(f->fusion, "qk_norm_rope");
        bool avail = builtin || fused_op_registered(f->fusion);
        const char *effect;
        if (builtin)
            effect = want ? "applies: always on in qwenrt"
                          : "no effect: qwenrt has no unfused twin of this";
        else if (!want)
            effect = "applies: off (unfused ops)";
        else if (avail)
            effect = "applies: fused op";
        else if (p->capability_aware && p->remap && p->remap_in_scope) {
            effect = "remapped: runs unfused";
            json_array_append_new(
                b->remaps,
                json_sprintf(
                    "fusion %s (%s): no fused '%s' kernel on the CPU backend -> unfused %s",
                    f->flag, f->ops, f->fusion, f->ops));
        } else
            return err_set(
                err, QWENRT_ERR_UNSUPPORTED,
                "%s: session.%s asks for fused op '%s', which the CPU backend does not have (kernelPathPolicy locked; use capability-aware + remap to run unfused)",
                p->path, f->flag, f->fusion);
        json_array_append_new(b->fusions,
                              json_pack("{s:s, s:s?, s:s, s:b, s:b, s:s}", "flag", f->flag,
                                        "fusion", f->fusion, "fuses", f->ops, "requested", want,
                                        "available", avail, "effect", effect));
    }
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ executionPatch.set */

static const char *const section_names[] = {"prefill", "decode", "preLayer", "postLayer"};

static bool in_section(const struct plan *pl, int32_t i, int ph, int section)
{
    const struct plan_op *op = &pl->ops[i];
    if (section == SECTION_ANY)
        return true;
    if (op->layer >= 0)
        return section == ph;
    bool before = true; /* a global op before any layer op is preLayer */
    for (int32_t j = 0; j < i; j++)
        if (pl->ops[j].layer >= 0)
            before = false;
    return section == (before ? SECTION_PRE_LAYER : SECTION_POST_LAYER);
}

/* Why key cannot run for op here (NULL when it can). Sets *wrong_op for a kernel of another
 * op kind (always an error). */
static const char *incompatibility(const char *key, const struct profile_kernel *alias,
                                   const struct plan_op *op, uint32_t features, bool *wrong_op,
                                   char *buf, size_t len)
{
    *wrong_op = false;
    if (alias && !is_registry_key(key)) {
        const char *dot = strrchr(alias->kernel, '.');
        snprintf(buf, len, "%s#%s is a %s source of another runtime, with no CPU build%s%s",
                 alias->kernel, alias->entry, dot ? dot + 1 : "foreign",
                 alias->kv_dtype ? "; it also wants a KV cache of " : "",
                 alias->kv_dtype ? alias->kv_dtype : "");
        if (alias->kv_dtype)
            snprintf(buf + strlen(buf), len - strlen(buf), " (qwenrt's CPU cache is f32)");
        return buf;
    }
    const struct cpu_matmul_variant *mv = matmul_by_key(key);
    const struct cpu_op_kernel *k = op_kernel_by_key(key);
    if (mv) {
        if (op->kind != OP_MATMUL) {
            *wrong_op = true;
            return "a matmul variant";
        }
        if (op->w && op->w->dtype != mv->wtype) {
            snprintf(buf, len, "%s is for %s weights, this op's weight is %s", key,
                     dtype_traits(mv->wtype)->name, dtype_traits(op->w->dtype)->name);
            return buf;
        }
        if ((mv->cpu_features & features) != mv->cpu_features) {
            char need[64];
            cpu_features_describe(mv->cpu_features, need, sizeof(need));
            snprintf(buf, len, "%s needs CPU features %s", key, need);
            return buf;
        }
        return NULL;
    }
    if (k->kind != op->kind) {
        *wrong_op = true;
        snprintf(buf, len, "a kernel of op %s", op_kind_name(k->kind));
        return buf;
    }
    if ((k->cpu_features & features) != k->cpu_features) {
        char need[64];
        cpu_features_describe(k->cpu_features, need, sizeof(need));
        snprintf(buf, len, "%s needs CPU features %s", key, need);
        return buf;
    }
    return NULL;
}

/* Interns a reason string in b->reasons (json strings live as long as the binding). */
static const char *intern_reason(struct profile_binding *b, const char *why)
{
    size_t i;
    json_t *v;
    json_array_foreach (b->reasons, i, v)
        if (!strcmp(json_string_value(v), why))
            return json_string_value(v);
    json_array_append_new(b->reasons, json_string(why));
    return json_string_value(json_array_get(b->reasons, json_array_size(b->reasons) - 1));
}

static qwenrt_status apply_set(const struct profile *p, int si, const struct plan plans[2],
                               uint32_t features, struct profile_binding *b,
                               struct qwenrt_error *err)
{
    const struct profile_set *s = &p->sets[si];
    const struct profile_kernel *alias = NULL;
    for (int i = 0; i < p->n_kernels; i++)
        if (!strcmp(p->kernels[i].key, s->kernel_key))
            alias = &p->kernels[i];
    const char *key = alias ? alias->kernel : s->kernel_key;
    if (!alias && !is_registry_key(key))
        return err_set(
            err, QWENRT_ERR_NOT_FOUND,
            "%s: executionPatch.set[%d]: unknown kernel key '%s' (not in addKernels, not a CPU kernel)",
            p->path, si, s->kernel_key);
    const char *static_key = op_kernel_by_key(key) ? op_kernel_by_key(key)->key
                             : matmul_by_key(key)  ? matmul_by_key(key)->key
                                                   : NULL;
    int32_t matched = 0;
    char reason[512];
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < plans[ph].n_ops; i++) {
            const struct plan_op *op = &plans[ph].ops[i];
            if (strcmp(op_kind_name(op->kind), s->op) || !in_section(&plans[ph], i, ph, s->section))
                continue;
            matched++;
            bool wrong_op;
            const char *why =
                incompatibility(key, alias, op, features, &wrong_op, reason, sizeof(reason));
            if (wrong_op)
                return err_set(
                    err, QWENRT_ERR_INVALID_ARG,
                    "%s: executionPatch.set[%d]: kernel '%s' is %s, it cannot bind op '%s'",
                    p->path, si, s->kernel_key, why, s->op);
            struct profile_op_binding *ob = &b->ops[ph][i];
            if (!why) {
                ob->requested = s->kernel_key;
                ob->key = static_key;
                ob->remapped = false;
                ob->why = NULL;
                continue;
            }
            if (!(p->capability_aware && p->remap && p->remap_in_scope))
                return err_set(
                    err, QWENRT_ERR_UNSUPPORTED,
                    "%s: executionPatch.set[%d] (%s %s, layer %d): kernel '%s' cannot run here: %s (kernelPathPolicy %s, onIncompatible %s)",
                    p->path, si, section_names[ph], s->op, op->layer, s->kernel_key, reason,
                    p->capability_aware ? "capability-aware" : "locked",
                    p->remap ? "remap" : "error");
            if (ob->requested && !ob->remapped)
                continue; /* an earlier set entry bound a kernel that runs: keep it */
            ob->key = default_key(op, features);
            ob->requested = s->kernel_key;
            ob->remapped = true;
            ob->why = intern_reason(b, reason);
        }
    if (!matched)
        return err_set(err, QWENRT_ERR_NOT_FOUND,
                       "%s: executionPatch.set[%d] (section %s, op '%s') matches no op of the plan",
                       p->path, si, s->section == SECTION_ANY ? "any" : section_names[s->section],
                       s->op);
    return QWENRT_OK;
}

/* One line per (phase, op, requested, fallback, reason) group of remapped ops. */
static void describe_remaps(const struct plan plans[2], struct profile_binding *b)
{
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < b->n_ops[ph]; i++) {
            const struct profile_op_binding *ob = &b->ops[ph][i];
            bool seen = false;
            for (int32_t j = 0; j < i && !seen; j++) {
                const struct profile_op_binding *o = &b->ops[ph][j];
                seen = o->remapped && plans[ph].ops[j].kind == plans[ph].ops[i].kind &&
                       o->why == ob->why && o->key == ob->key &&
                       !strcmp(o->requested, ob->requested);
            }
            if (!ob->remapped || seen)
                continue;
            char layers[256] = "";
            int32_t n = 0, last = -2;
            for (int32_t j = i; j < b->n_ops[ph]; j++) {
                const struct profile_op_binding *o = &b->ops[ph][j];
                if (!o->remapped || plans[ph].ops[j].kind != plans[ph].ops[i].kind ||
                    o->why != ob->why || o->key != ob->key || strcmp(o->requested, ob->requested))
                    continue;
                n++;
                int32_t l = plans[ph].ops[j].layer;
                size_t len = strlen(layers);
                if (l != last && len + 16 < sizeof(layers))
                    snprintf(layers + len, sizeof(layers) - len, "%s%d", len ? "," : "", l);
                last = l;
            }
            json_array_append_new(
                b->remaps, json_sprintf("%s %s (%d ops, layers %s): %s -> %s, because %s",
                                        section_names[ph], op_kind_name(plans[ph].ops[i].kind), n,
                                        layers, ob->requested, ob->key, ob->why));
        }
}

/* ------------------------------------------------------------------ public */

static qwenrt_status binding_init(const struct plan plans[2], struct profile_binding *b,
                                  struct qwenrt_error *err)
{
    memset(b, 0, sizeof(*b));
    b->remaps = json_array();
    b->fusions = json_array();
    b->reasons = json_array();
    for (int ph = 0; ph < 2; ph++) {
        b->n_ops[ph] = plans[ph].n_ops;
        b->ops[ph] = xcalloc((size_t)plans[ph].n_ops + 1, sizeof(*b->ops[ph]));
        if (!b->ops[ph])
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    return b->remaps && b->fusions && b->reasons ? QWENRT_OK
                                                 : err_set(err, QWENRT_ERR_NOMEM, "out of memory");
}

qwenrt_status profile_bind(const struct profile *p, const struct plan plans[2], uint32_t features,
                           struct profile_binding *b, struct qwenrt_error *err)
{
    qwenrt_status st = binding_init(plans, b, err);
    for (int ph = 0; ph < 2 && !st; ph++)
        for (int32_t i = 0; i < plans[ph].n_ops && !st; i++) {
            b->ops[ph][i].key = default_key(&plans[ph].ops[i], features);
            if (!b->ops[ph][i].key)
                st = err_set(err, QWENRT_ERR_UNSUPPORTED, "no CPU kernel for op %s",
                             op_kind_name(plans[ph].ops[i].kind));
        }
    for (int si = 0; si < p->n_sets && !st; si++)
        st = apply_set(p, si, plans, features, b, err);
    if (!st)
        describe_remaps(plans, b);
    if (!st)
        st = bind_fusions(p, b, err);
    if (st)
        profile_binding_free(b);
    return st;
}

qwenrt_status profile_bind_reference(const struct plan plans[2], struct profile_binding *b,
                                     struct qwenrt_error *err)
{
    qwenrt_status st = binding_init(plans, b, err);
    for (int ph = 0; ph < 2 && !st; ph++)
        for (int32_t i = 0; i < plans[ph].n_ops && !st; i++) {
            const struct plan_op *op = &plans[ph].ops[i];
            char key[64];
            if (op->kind == OP_MATMUL && op->w)
                snprintf(key, sizeof(key), "matmul.%s.ref", dtype_traits(op->w->dtype)->name);
            else
                snprintf(key, sizeof(key), "%s.ref", op_kind_name(op->kind));
            const struct cpu_matmul_variant *mv = matmul_by_key(key);
            const struct cpu_op_kernel *k = op_kernel_by_key(key);
            /* ops without a .ref key (matmul.auto without weights, logits.auto) keep their one
             * kernel */
            b->ops[ph][i].key = mv ? mv->key : k ? k->key : default_key(op, 0);
            if (!b->ops[ph][i].key)
                st = err_set(err, QWENRT_ERR_UNSUPPORTED, "no reference kernel for op %s",
                             op_kind_name(op->kind));
        }
    if (st)
        profile_binding_free(b);
    return st;
}

void profile_apply(const struct profile_binding *b, struct plan plans[2])
{
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < plans[ph].n_ops && i < b->n_ops[ph]; i++)
            plans[ph].ops[i].kernel = b->ops[ph][i].key;
}

void profile_binding_free(struct profile_binding *b)
{
    if (!b)
        return;
    xfree(b->ops[0]);
    xfree(b->ops[1]);
    json_decref(b->remaps);
    json_decref(b->fusions);
    json_decref(b->reasons);
    memset(b, 0, sizeof(*b));
}

qwenrt_status profile_vocabulary_plans(struct plan plans[2], struct qwenrt_error *err)
{
    for (int ph = 0; ph < 2; ph++) {
        if (!plan_init(&plans[ph], (enum plan_phase)ph))
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
        plan_add_op(&plans[ph], OP_EMBED, -1);
        for (int k = OP_RMSNORM; k < OP_LOGITS; k++)
            plan_add_op(&plans[ph], (enum op_kind)k, 0);
        plan_add_op(&plans[ph], OP_RMSNORM, -1);
        plan_add_op(&plans[ph], OP_LOGITS, -1);
        if (plans[ph].failed)
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    return QWENRT_OK;
}
