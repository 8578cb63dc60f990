/*
 * profile.c — loading runtime profiles: files, extends chains, merging, validation
 * (see profile.h). Binding to kernels is in profile_bind.c.
 *
 * Every file of a chain must carry the seed 000 metadata (id, name, owner, intent,
 * compatibleIntents, stability, createdAtUtc); the runtime object is validated once, on the
 * resolved profile, because a base may leave a setting that a child completes.
 * The resolved profile's sha256 is taken over compact JSON with sorted keys, so two files that
 * resolve to the same settings have the same hash. Profiles only choose among kernels and
 * cadences; they never change storage facts (weights, dtypes of files).
 */
#include "runtime/profile.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/sha256.h"

static const char *const intent_names[] = {"verify", "investigate", "calibrate"};

unsigned profile_intent_from_name(const char *name)
{
    for (unsigned i = 0; i < 3; i++)
        if (name && !strcmp(name, intent_names[i]))
            return 1u << i;
    return 0;
}

const char *profile_intent_name(unsigned intent)
{
    for (unsigned i = 0; i < 3; i++)
        if (intent == 1u << i)
            return intent_names[i];
    return "?";
}

/* ------------------------------------------------------------------ merge */

json_t *profile_merge(json_t *base, json_t *over, const char *path, json_t *warnings)
{
    if (!json_is_object(base) || !json_is_object(over)) {
        if (warnings && base && over && json_typeof(base) != json_typeof(over) &&
            !json_is_null(base))
            json_array_append_new(warnings, json_sprintf("%s: type changes from the base's", path));
        return json_deep_copy(over);
    }
    json_t *out = json_deep_copy(base);
    const char *key;
    json_t *v;
    json_object_foreach (over, key, v) {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s.%s", path, key);
        if (json_is_null(v)) { /* null resets: back to the default, i.e. absent */
            json_object_del(out, key);
            continue;
        }
        json_t *b = json_object_get(out, key);
        json_object_set_new(out, key, b ? profile_merge(b, v, sub, warnings) : json_deep_copy(v));
    }
    return out;
}

/* ------------------------------------------------------------------ metadata */

static bool is_iso8601(const char *s)
{
    int y, mo, d, h, mi, sec, n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || n != 19)
        return false;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return false;
    s += n;
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return false;
        while (isdigit((unsigned char)*s))
            s++;
    }
    if (!strcmp(s, "Z"))
        return true;
    int oh, om;
    return (s[0] == '+' || s[0] == '-') && sscanf(s + 1, "%2d:%2d%n", &oh, &om, &n) == 2 &&
           n == 5 && s[6] == 0 && oh <= 23 && om <= 59;
}

static qwenrt_status need_string(json_t *doc, const char *key, const char *path, const char **out,
                                 struct qwenrt_error *err)
{
    json_t *v = json_object_get(doc, key);
    if (!v)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: missing required field '%s'", path, key);
    if (!json_is_string(v) || !json_string_length(v))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: field '%s' must be a non-empty string", path,
                       key);
    if (out)
        *out = json_string_value(v);
    return QWENRT_OK;
}

/* The metadata every profile file carries (Doppler validates the same fields). */
static qwenrt_status check_metadata(json_t *doc, const char *path, unsigned *intent,
                                    unsigned *compat, struct qwenrt_error *err)
{
    static const char *const required[] = {"id", "name", "owner"};
    const char *s;
    for (int i = 0; i < 3; i++)
        if (need_string(doc, required[i], path, NULL, err))
            return err->status;
    if (need_string(doc, "intent", path, &s, err))
        return err->status;
    if (!(*intent = profile_intent_from_name(s)))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: intent '%s' is not one of verify, investigate, calibrate", path, s);
    json_t *ci = json_object_get(doc, "compatibleIntents");
    if (!ci)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: missing required field 'compatibleIntents'",
                       path);
    if (!json_is_array(ci) || json_array_size(ci) == 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: compatibleIntents must be a non-empty array",
                       path);
    *compat = 0;
    size_t i;
    json_t *v;
    json_array_foreach (ci, i, v) {
        unsigned b = profile_intent_from_name(json_string_value(v));
        if (!b)
            return err_set(
                err, QWENRT_ERR_FORMAT,
                "%s: compatibleIntents[%zu] is not one of verify, investigate, calibrate", path, i);
        if (*compat & b)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: compatibleIntents lists '%s' twice", path,
                           profile_intent_name(b));
        *compat |= b;
    }
    if (!(*compat & *intent))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: compatibleIntents must contain the intent '%s'",
                       path, profile_intent_name(*intent));
    if (need_string(doc, "stability", path, &s, err))
        return err->status;
    if (strcmp(s, "canonical") && strcmp(s, "experimental") && strcmp(s, "deprecated"))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: stability '%s' is not one of canonical, experimental, deprecated", path,
                       s);
    if (need_string(doc, "createdAtUtc", path, &s, err))
        return err->status;
    if (!is_iso8601(s))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: createdAtUtc '%s' is not an ISO-8601 time",
                       path, s);
    json_t *ext = json_object_get(doc, "extends");
    if (ext && !json_is_string(ext) && !json_is_array(ext) && !json_is_null(ext))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: extends must be a profile id or a list of ids",
                       path);
    json_t *rt = json_object_get(doc, "runtime");
    if (rt && !json_is_object(rt))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: runtime must be an object", path);
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ files and chains */

/* The file of an id: the id itself when it is a readable file, else <dir>/<id>.json with a
 * leading "profiles/" dropped, else next to `near` (the file that extends it). */
static char *find_file(const char *id, const char *dir, const char *near)
{
    char buf[1024];
    if (strchr(id, '.') && access(id, R_OK) == 0)
        return xstrdup(id);
    const char *base = strncmp(id, "profiles/", 9) == 0 ? id + 9 : id;
    if (dir) {
        snprintf(buf, sizeof(buf), "%s/%s.json", dir, base);
        if (access(buf, R_OK) == 0)
            return xstrdup(buf);
    }
    if (near) {
        const char *slash = strrchr(near, '/');
        int n = slash ? (int)(slash - near) : 1;
        snprintf(buf, sizeof(buf), "%.*s/%s.json", n, slash ? near : ".", base);
        if (access(buf, R_OK) == 0)
            return xstrdup(buf);
    }
    return NULL;
}

struct loader {
    const char *dir;
    const char *stack[PROFILE_MAX_CHAIN]; /* ids being resolved, for cycle detection */
    int depth;
    struct profile *p;
};

static qwenrt_status cycle_error(struct loader *L, const char *id, struct qwenrt_error *err)
{
    char msg[400] = "";
    size_t n = 0;
    for (int i = 0; i < L->depth && n < sizeof(msg); i++)
        n += (size_t)snprintf(msg + n, sizeof(msg) - n, "%s -> ", L->stack[i]);
    return err_set(err, QWENRT_ERR_FORMAT, "profile extends cycle: %s%s", msg, id);
}

/* Resolves id (and its bases) into a merged document *out. */
static qwenrt_status resolve(struct loader *L, const char *id, const char *near, json_t **out,
                             struct qwenrt_error *err)
{
    for (int i = 0; i < L->depth; i++)
        if (!strcmp(L->stack[i], id))
            return cycle_error(L, id, err);
    if (L->depth == PROFILE_MAX_CHAIN || L->p->n_chain == PROFILE_MAX_CHAIN)
        return err_set(err, QWENRT_ERR_LIMIT, "profile '%s': extends chain deeper than %d", id,
                       PROFILE_MAX_CHAIN);
    char *path = find_file(id, L->dir, near);
    if (!path)
        return err_set(err, QWENRT_ERR_NOT_FOUND, "profile '%s' not found (looked in %s/)", id,
                       L->dir ? L->dir : "profiles");
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    qwenrt_status st = QWENRT_OK;
    json_t *merged = NULL;
    if (!doc) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        goto out_free_path;
    }
    if (!json_is_object(doc)) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: a profile must be a JSON object", path);
        goto out_free_doc;
    }
    unsigned intent, compat;
    if ((st = check_metadata(doc, path, &intent, &compat, err)))
        goto out_free_doc;
    L->stack[L->depth++] = id;
    json_t *ext = json_object_get(doc, "extends");
    json_t *list = json_is_string(ext) ? json_pack("[O]", ext) : json_incref(ext);
    merged = json_object();
    size_t i;
    json_t *e;
    json_array_foreach (list, i, e) {
        json_t *b = NULL;
        if (!json_is_string(e)) {
            st = err_set(err, QWENRT_ERR_FORMAT, "%s: extends[%zu] must be a profile id", path, i);
            break;
        }
        if ((st = resolve(L, json_string_value(e), path, &b, err)))
            break;
        json_t *m = profile_merge(merged, b, "", L->p->warnings);
        json_decref(b);
        json_decref(merged);
        merged = m;
    }
    json_decref(list);
    L->depth--;
    if (!st) {
        json_t *m = profile_merge(merged, doc, "", L->p->warnings);
        json_decref(merged);
        merged = m;
        L->p->chain[L->p->n_chain++] = xstrdup(json_string_value(json_object_get(doc, "id")));
        if (L->depth == 0) {
            L->p->path = path;
            path = NULL;
        }
        *out = merged;
        merged = NULL;
    }
    json_decref(merged);
out_free_doc:
    json_decref(doc);
out_free_path:
    xfree(path);
    return st;
}

/* ------------------------------------------------------------------ runtime settings */

static const char *str_or(json_t *o, const char *key, const char *dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

static bool is_digest(const char *s)
{
    if (!s || strncmp(s, "sha256:", 7) || strlen(s) != 71)
        return false;
    for (s += 7; *s; s++)
        if (!isxdigit((unsigned char)*s))
            return false;
    return true;
}

static qwenrt_status parse_add_kernels(struct profile *p, json_t *arr, struct qwenrt_error *err)
{
    if (!arr)
        return QWENRT_OK;
    if (!json_is_array(arr))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: executionPatch.addKernels must be an array",
                       p->path);
    p->kernels = xcalloc(json_array_size(arr) + 1, sizeof(*p->kernels));
    if (!p->kernels)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *e;
    json_array_foreach (arr, i, e) {
        json_t *k = json_object_get(e, "kernel");
        const char *key = str_or(e, "key", NULL);
        if (!key || !json_is_object(k) || !str_or(k, "kernel", NULL) || !str_or(k, "entry", NULL))
            return err_set(
                err, QWENRT_ERR_FORMAT,
                "%s: executionPatch.addKernels[%zu] needs key and kernel{kernel, entry, digest}",
                p->path, i);
        if (!is_digest(str_or(k, "digest", NULL)))
            return err_set(
                err, QWENRT_ERR_FORMAT,
                "%s: executionPatch.addKernels[%zu] ('%s'): digest must be \"sha256:<64 hex digits>\"",
                p->path, i, key);
        for (int j = 0; j < p->n_kernels; j++)
            if (!strcmp(p->kernels[j].key, key))
                return err_set(err, QWENRT_ERR_FORMAT,
                               "%s: executionPatch.addKernels[%zu]: key '%s' already exists",
                               p->path, i, key);
        struct profile_kernel *pk = &p->kernels[p->n_kernels++];
        pk->key = xstrdup(key);
        pk->kernel = xstrdup(str_or(k, "kernel", ""));
        pk->entry = xstrdup(str_or(k, "entry", ""));
        pk->digest = xstrdup(str_or(k, "digest", ""));
        const char *kv = str_or(json_object_get(k, "precision"), "kvDtype", NULL);
        pk->kv_dtype = kv ? xstrdup(kv) : NULL;
    }
    return QWENRT_OK;
}

static int section_from_name(const char *s)
{
    static const char *const names[] = {"prefill", "decode", "preLayer", "postLayer"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -2;
}

static qwenrt_status parse_sets(struct profile *p, json_t *arr, struct qwenrt_error *err)
{
    if (!arr)
        return QWENRT_OK;
    if (!json_is_array(arr))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: executionPatch.set must be an array", p->path);
    p->sets = xcalloc(json_array_size(arr) + 1, sizeof(*p->sets));
    if (!p->sets)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *e;
    json_array_foreach (arr, i, e) {
        const char *op = str_or(e, "op", NULL), *key = str_or(e, "kernelKey", NULL);
        const char *sec = str_or(e, "section", NULL);
        if (!op)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: executionPatch.set[%zu]: missing 'op'",
                           p->path, i);
        if (json_object_get(e, "weights"))
            return err_set(
                err, QWENRT_ERR_UNSUPPORTED,
                "%s: executionPatch.set[%zu]: 'weights' rewrites are not supported (weights are storage facts)",
                p->path, i);
        if (!key)
            return err_set(err, QWENRT_ERR_FORMAT,
                           "%s: executionPatch.set[%zu]: missing 'kernelKey'", p->path, i);
        int s = sec ? section_from_name(sec) : SECTION_ANY;
        if (s == -2)
            return err_set(
                err, QWENRT_ERR_FORMAT,
                "%s: executionPatch.set[%zu]: section '%s' is not one of decode, prefill, preLayer, postLayer",
                p->path, i, sec);
        struct profile_set *ps = &p->sets[p->n_sets++];
        ps->section = s;
        ps->op = xstrdup(op);
        ps->kernel_key = xstrdup(key);
    }
    return QWENRT_OK;
}

static qwenrt_status get_count(struct profile *p, json_t *o, const char *where, const char *key,
                               int32_t min, int32_t *out, struct qwenrt_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return QWENRT_OK;
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > 1 << 20)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: %s.%s must be an integer >= %d", p->path, where,
                       key, min);
    *out = (int32_t)json_integer_value(v);
    return QWENRT_OK;
}

/* batching or session.decodeLoop: one cadence description (Doppler's rules). */
static qwenrt_status parse_cadence(struct profile *p, json_t *o, const char *where,
                                   struct qwenrt_error *err)
{
    struct profile_decode_loop *d = &p->decode;
    if (!o)
        return QWENRT_OK;
    if (!json_is_object(o))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: %s must be an object", p->path, where);
    d->given = true;
    if (get_count(p, o, where, "batchSize", 1, &d->batch_size, err) ||
        get_count(p, o, where, "readbackInterval", 1, &d->readback_interval, err) ||
        get_count(p, o, where, "maxBatchDecodeTokens", 1, &d->max_batch_decode_tokens, err) ||
        get_count(p, o, where, "ringTokens", 1, &d->ring_tokens, err) ||
        get_count(p, o, where, "ringStop", 1, &d->ring_stop, err) ||
        get_count(p, o, where, "ringStaging", 1, &d->ring_staging, err))
        return err->status;
    const char *stop =
        str_or(o, "stopCheckMode", d->stop_check_mode[0] ? d->stop_check_mode : "batch");
    if (strcmp(stop, "batch") && strcmp(stop, "per-token"))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: %s.stopCheckMode '%s' is not one of batch, per-token", p->path, where,
                       stop);
    snprintf(d->stop_check_mode, sizeof(d->stop_check_mode), "%s", stop);
    const char *mode =
        str_or(o, "readbackMode", d->readback_mode[0] ? d->readback_mode : "sequential");
    if (strcmp(mode, "sequential") && strcmp(mode, "overlapped") && strcmp(mode, "auto"))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: %s.readbackMode '%s' is not one of sequential, overlapped, auto",
                       p->path, where, mode);
    snprintf(d->readback_mode, sizeof(d->readback_mode), "%s", mode);
    if (!strcmp(mode, "overlapped") && d->ring_staging < 2)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: %s.readbackMode 'overlapped' needs ringStaging >= 2 (it is %d)",
                       p->path, where, d->ring_staging);
    if (!strcmp(mode, "auto") && !json_is_number(json_object_get(o, "submitLatencyThresholdMs")))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: %s.readbackMode 'auto' needs submitLatencyThresholdMs", p->path, where);
    return QWENRT_OK;
}

/* An integer key of cudaTuning: absent leaves *out; else one of `allowed` (n_allowed > 0) or
 * in [lo, hi]. */
static qwenrt_status cuda_int(struct profile *p, json_t *o, const char *key, const int *allowed,
                              int n_allowed, int lo, int hi, int32_t *out, struct qwenrt_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return QWENRT_OK;
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
    bool ok = false;
    for (int i = 0; i < n_allowed; i++)
        ok = ok || x == allowed[i];
    if (!n_allowed)
        ok = x == 0 || (x >= lo && x <= hi);
    if (!ok) {
        char list[96] = "";
        for (int i = 0; i < n_allowed; i++)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%d", i ? ", " : "", allowed[i]);
        if (!n_allowed)
            snprintf(list, sizeof(list), "0 or %d to %d", lo, hi);
        return err_set(err, QWENRT_ERR_FORMAT, "%s: cudaTuning.%s must be one of %s", p->path, key, list);
    }
    *out = (int32_t)x;
    return QWENRT_OK;
}

/* A launch-order key of cudaTuning: "auto" 0, "before-wait" 1, "after-wait" 2. */
static qwenrt_status cuda_launch(struct profile *p, json_t *o, const char *key, int32_t *out,
                                 struct qwenrt_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return QWENRT_OK;
    const char *s = json_string_value(v);
    static const char *const names[] = {"auto", "before-wait", "after-wait"};
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return QWENRT_OK;
        }
    return err_set(err, QWENRT_ERR_FORMAT,
                   "%s: cudaTuning.%s must be one of auto, before-wait, after-wait", p->path, key);
}

/* The attention's cluster merge: attnCluster "auto" 0, "never" -1, "always" 1, "window" 2, and
 * the window's positions attnClusterFrom / attnClusterUntil (0 or 1 to 4,194,304; until after
 * from when both are given). */
static qwenrt_status cuda_cluster(struct profile *p, json_t *o, struct model_cuda_tuning *t,
                                  struct qwenrt_error *err)
{
    json_t *v = json_object_get(o, "attnCluster");
    if (v) {
        const char *s = json_string_value(v);
        static const char *const names[] = {"never", "auto", "always", "window"};
        int found = -2;
        for (int i = 0; s && i < 4; i++)
            found = !strcmp(s, names[i]) ? i - 1 : found;
        if (found < -1)
            return err_set(err, QWENRT_ERR_FORMAT,
                           "%s: cudaTuning.attnCluster must be one of never, auto, always, window", p->path);
        t->attn_cluster = found;
    }
    if (cuda_int(p, o, "attnClusterFrom", NULL, 0, 1, 1 << 22, &t->attn_cluster_from, err) ||
        cuda_int(p, o, "attnClusterUntil", NULL, 0, 1, 1 << 22, &t->attn_cluster_until, err))
        return err->status;
    if (t->attn_cluster_from && t->attn_cluster_until && t->attn_cluster_until <= t->attn_cluster_from)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: cudaTuning.attnClusterUntil (%d) must be after attnClusterFrom (%d)",
                       p->path, (int)t->attn_cluster_until, (int)t->attn_cluster_from);
    return QWENRT_OK;
}

/* runtime.inference.cudaTuning: the CUDA decode's shape choices (struct model_cuda_tuning;
 * the limits are cuda_options' own, checked again when a CUDA session starts). Unknown keys
 * are refused so that a misspelt choice cannot pass silently. */
static qwenrt_status parse_cuda_tuning(struct profile *p, json_t *o, struct qwenrt_error *err)
{
    if (!o)
        return QWENRT_OK;
    if (!json_is_object(o))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: runtime.inference.cudaTuning must be an object", p->path);
    static const char *const keys[] = {"gemvSmemWarps", "gemvSmemKb", "gemvSmemLaunch", "gemvqRows",
                                       "gemvqLaunch",   "gemvqWarps", "gemvqSmemKb",    "pdl",
                                       "attnSplitMin",  "attnCluster", "attnClusterFrom", "attnClusterUntil"};
    const char *k;
    json_t *v;
    json_object_foreach (o, k, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            known = known || !strcmp(k, keys[i]);
        if (!known)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: cudaTuning.%s is not a CUDA tuning key", p->path, k);
    }
    static const int warps[] = {0, 1, 2, 4, 8, 16}, rows[] = {0, 1, 2, 4}, qwarps[] = {0, 4, 8};
    struct model_cuda_tuning *t = &p->cuda;
    json_t *pdl = json_object_get(o, "pdl");
    if (pdl && !json_is_boolean(pdl))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: cudaTuning.pdl must be true or false", p->path);
    t->pdl = pdl ? json_is_true(pdl) : t->pdl;
    p->cuda_given = true;
    if (cuda_int(p, o, "gemvSmemWarps", warps, 6, 0, 0, &t->gemv_smem_warps, err) ||
        cuda_int(p, o, "gemvSmemKb", NULL, 0, 16, 226, &t->gemv_smem_kb, err) ||
        cuda_launch(p, o, "gemvSmemLaunch", &t->gemv_smem_launch, err) ||
        cuda_int(p, o, "gemvqRows", rows, 4, 0, 0, &t->gemvq_rows, err) ||
        cuda_launch(p, o, "gemvqLaunch", &t->gemvq_launch, err) ||
        cuda_int(p, o, "gemvqWarps", qwarps, 3, 0, 0, &t->gemvq_warps, err) ||
        cuda_int(p, o, "gemvqSmemKb", NULL, 0, 1, 200, &t->gemvq_smem_kb, err) ||
        cuda_int(p, o, "attnSplitMin", NULL, 0, 16, 4096, &t->attn_split_min, err) ||
        cuda_cluster(p, o, t, err))
        return err->status;
    return QWENRT_OK;
}

static qwenrt_status parse_policy(struct profile *p, json_t *o, struct qwenrt_error *err)
{
    if (!o)
        return QWENRT_OK;
    if (!json_is_object(o))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: kernelPathPolicy must be an object", p->path);
    const char *mode = str_or(o, "mode", "locked"), *inc = str_or(o, "onIncompatible", "error");
    if (strcmp(mode, "locked") && strcmp(mode, "capability-aware"))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: kernelPathPolicy.mode '%s' is not one of locked, capability-aware",
                       p->path, mode);
    if (strcmp(inc, "error") && strcmp(inc, "remap"))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: kernelPathPolicy.onIncompatible '%s' is not one of error, remap",
                       p->path, inc);
    p->capability_aware = !strcmp(mode, "capability-aware");
    p->remap = !strcmp(inc, "remap");
    json_t *scope = json_object_get(o, "sourceScope"), *allow = json_object_get(o, "allowSources");
    if (scope && allow && !json_equal(scope, allow))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: kernelPathPolicy.sourceScope and allowSources differ", p->path);
    json_t *sc = scope ? scope : allow;
    p->remap_in_scope = sc == NULL;
    size_t i;
    json_t *v;
    if (sc && !json_is_array(sc))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: kernelPathPolicy.sourceScope must be an array",
                       p->path);
    json_array_foreach (sc, i, v) {
        const char *s = json_string_value(v);
        if (!s || (strcmp(s, "model") && strcmp(s, "manifest") && strcmp(s, "config")))
            return err_set(
                err, QWENRT_ERR_FORMAT,
                "%s: kernelPathPolicy.sourceScope[%zu] is not one of model, manifest, config",
                p->path, i);
        if (!strcmp(s, "manifest") || !strcmp(s, "config"))
            p->remap_in_scope = true;
    }
    return QWENRT_OK;
}

static qwenrt_status parse_runtime(struct profile *p, struct qwenrt_error *err)
{
    json_t *inf = json_object_get(json_object_get(p->doc, "runtime"), "inference");
    if (!inf)
        return QWENRT_OK;
    if (!json_is_object(inf))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: runtime.inference must be an object", p->path);
    json_t *patch = json_object_get(inf, "executionPatch");
    if (patch) {
        static const char *const unsupported[] = {"layers", "remove", "add"};
        for (int i = 0; i < 3; i++)
            if (json_object_get(patch, unsupported[i]))
                return err_set(err, QWENRT_ERR_UNSUPPORTED,
                               "%s: executionPatch.%s is not supported yet", p->path,
                               unsupported[i]);
        qwenrt_status st = parse_add_kernels(p, json_object_get(patch, "addKernels"), err);
        if (!st)
            st = parse_sets(p, json_object_get(patch, "set"), err);
        if (st)
            return st;
    }
    json_t *session = json_object_get(inf, "session");
    if (session && !json_is_object(session))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: runtime.inference.session must be an object",
                       p->path);
    qwenrt_status st = parse_cadence(p, json_object_get(inf, "batching"), "batching", err);
    if (!st)
        st = parse_cadence(p, json_object_get(session, "decodeLoop"), "session.decodeLoop", err);
    if (!st)
        st = parse_policy(p, json_object_get(inf, "kernelPathPolicy"), err);
    if (!st)
        st = parse_cuda_tuning(p, json_object_get(inf, "cudaTuning"), err);
    return st;
}

/* ------------------------------------------------------------------ public */

static qwenrt_status finish(struct profile *p, json_t *doc, struct qwenrt_error *err)
{
    p->doc = doc;
    p->id = xstrdup(json_string_value(json_object_get(doc, "id")));
    p->intent = profile_intent_from_name(str_or(doc, "intent", ""));
    json_t *ci = json_object_get(doc, "compatibleIntents");
    size_t i;
    json_t *v;
    json_array_foreach (ci, i, v)
        p->compatible |= profile_intent_from_name(json_string_value(v));
    if (!p->path)
        p->path = xstrdup("(built-in)");
    char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    if (!p->id || !text) {
        free(text);
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    sha256_hex(text, strlen(text), p->sha256);
    free(text);
    return parse_runtime(p, err);
}

qwenrt_status profile_load(const char *id_or_path, const char *dir, struct profile **out,
                           struct qwenrt_error *err)
{
    *out = NULL;
    struct profile *p = xcalloc(1, sizeof(*p));
    if (!p || !(p->warnings = json_array())) {
        xfree(p);
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    struct loader L = {.dir = dir ? dir : "profiles", .p = p};
    json_t *doc = NULL;
    qwenrt_status st = resolve(&L, id_or_path, NULL, &doc, err);
    if (!st)
        st = finish(p, doc, err);
    if (st) {
        if (!p->doc)
            json_decref(doc);
        profile_free(p);
        return st;
    }
    *out = p;
    return QWENRT_OK;
}

qwenrt_status profile_default(struct profile **out, struct qwenrt_error *err)
{
    *out = NULL;
    json_error_t je;
    json_t *doc =
        json_loads("{\"id\": \"profiles/default\", \"name\": \"default\", \"description\": "
                   "\"qwenrt defaults: the best kernel for each op on this machine, no "
                   "fusions, locked kernel policy\", \"intent\": \"investigate\", "
                   "\"compatibleIntents\": [\"verify\", \"investigate\", \"calibrate\"], "
                   "\"stability\": \"canonical\", \"owner\": \"qwenrt\", "
                   "\"createdAtUtc\": \"2026-01-01T00:00:00Z\", \"runtime\": {}}",
                   0, &je);
    struct profile *p = xcalloc(1, sizeof(*p));
    if (!doc || !p || !(p->warnings = json_array())) {
        json_decref(doc);
        profile_free(p);
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    p->chain[p->n_chain++] = xstrdup("profiles/default");
    qwenrt_status st = finish(p, doc, err);
    if (st) {
        profile_free(p);
        return st;
    }
    *out = p;
    return QWENRT_OK;
}

qwenrt_status profile_check_intent(const struct profile *p, const char *command, unsigned intent,
                                   struct qwenrt_error *err)
{
    if (p->compatible & intent)
        return QWENRT_OK;
    char list[64] = "";
    for (unsigned b = 1; b <= PROFILE_INTENT_CALIBRATE; b <<= 1)
        if (p->compatible & b)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", list[0] ? ", " : "",
                     profile_intent_name(b));
    return err_set(
        err, QWENRT_ERR_INVALID_ARG,
        "profile '%s' is not compatible with '%s' (intent %s): its compatibleIntents are [%s]",
        p->id, command, profile_intent_name(intent), list);
}

void profile_free(struct profile *p)
{
    if (!p)
        return;
    json_decref(p->doc);
    json_decref(p->warnings);
    xfree(p->id);
    xfree(p->path);
    for (int i = 0; i < p->n_chain; i++)
        xfree(p->chain[i]);
    for (int i = 0; i < p->n_kernels; i++) {
        xfree(p->kernels[i].key);
        xfree(p->kernels[i].kernel);
        xfree(p->kernels[i].entry);
        xfree(p->kernels[i].digest);
        xfree(p->kernels[i].kv_dtype);
    }
    xfree(p->kernels);
    for (int i = 0; i < p->n_sets; i++) {
        xfree(p->sets[i].op);
        xfree(p->sets[i].kernel_key);
    }
    xfree(p->sets);
    xfree(p);
}
