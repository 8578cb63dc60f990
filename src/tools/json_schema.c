/*
 * json_schema.c — the JSON Schema subset checker (see json_schema.h). Recursive over the
 * document; the path of the current value is built in a fixed buffer as it descends.
 */
#include "tools/json_schema.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"

#define MAX_DEPTH 64

struct ctx {
    json_t *root;
    char path[1024];
    struct qwenrt_error *err;
};

static const char *type_of(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

static bool type_ok(const char *want, json_t *v)
{
    const char *t = type_of(v);
    return !strcmp(want, t) || (!strcmp(want, "number") && !strcmp(t, "integer"));
}

static qwenrt_status check(struct ctx *c, json_t *s, json_t *v, int depth);

static qwenrt_status fail(struct ctx *c, const char *what)
{
    return err_set(c->err, QWENRT_ERR_FORMAT, "%s: %s", c->path[0] ? c->path : "$", what);
}

static qwenrt_status check_child(struct ctx *c, json_t *s, json_t *v, const char *key, long index,
                                 int depth)
{
    size_t n = strlen(c->path);
    if (key)
        snprintf(c->path + n, sizeof(c->path) - n, ".%s", key);
    else
        snprintf(c->path + n, sizeof(c->path) - n, "[%ld]", index);
    qwenrt_status st = check(c, s, v, depth + 1);
    if (!st)
        c->path[n] = 0;
    return st;
}

static qwenrt_status check_type(struct ctx *c, json_t *s, json_t *v)
{
    json_t *t = json_object_get(s, "type");
    char msg[128];
    if (json_is_string(t) && !type_ok(json_string_value(t), v)) {
        snprintf(msg, sizeof(msg), "expected %s, got %s", json_string_value(t), type_of(v));
        return fail(c, msg);
    }
    if (json_is_array(t)) {
        size_t i;
        json_t *e;
        bool ok = false;
        json_array_foreach (t, i, e)
            ok |= type_ok(json_string_value(e), v);
        if (!ok) {
            snprintf(msg, sizeof(msg), "type %s is not allowed here", type_of(v));
            return fail(c, msg);
        }
    }
    return QWENRT_OK;
}

static qwenrt_status check_object(struct ctx *c, json_t *s, json_t *v, int depth)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *e;
    char msg[256];
    json_array_foreach (req, i, e)
        if (!json_object_get(v, json_string_value(e))) {
            snprintf(msg, sizeof(msg), "missing required key '%s'", json_string_value(e));
            return fail(c, msg);
        }
    const char *key;
    json_object_foreach (v, key, e) {
        json_t *ps = json_object_get(props, key);
        if (!ps && json_is_false(addl)) {
            snprintf(msg, sizeof(msg), "unexpected key '%s'", key);
            return fail(c, msg);
        }
        if (!ps && json_is_object(addl))
            ps = addl;
        if (ps && check_child(c, ps, e, key, 0, depth))
            return c->err->status;
    }
    return QWENRT_OK;
}

static qwenrt_status check(struct ctx *c, json_t *s, json_t *v, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(c, "nested too deeply");
    if (json_is_true(s) || !s)
        return QWENRT_OK;
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const char *r = json_string_value(ref);
        if (strncmp(r, "#/$defs/", 8))
            return err_set(c->err, QWENRT_ERR_INVALID_ARG,
                           "%s: only local $ref '#/$defs/...' is supported, not '%s'", c->path, r);
        json_t *target = json_object_get(json_object_get(c->root, "$defs"), r + 8);
        if (!target)
            return err_set(c->err, QWENRT_ERR_INVALID_ARG, "%s: $ref '%s' does not resolve",
                           c->path, r);
        return check(c, target, v, depth + 1);
    }
    if (check_type(c, s, v))
        return c->err->status;
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en) {
        size_t i;
        json_t *e;
        bool ok = false;
        json_array_foreach (en, i, e)
            ok |= json_equal(e, v);
        if (!ok)
            return fail(c, "value is not one of the enum");
    }
    if (cn && !json_equal(cn, v))
        return fail(c, "value differs from const");
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    if (json_is_number(v) && mn && json_number_value(v) < json_number_value(mn))
        return fail(c, "below minimum");
    if (json_is_number(v) && mx && json_number_value(v) > json_number_value(mx))
        return fail(c, "above maximum");
    json_t *ml = json_object_get(s, "minLength");
    if (json_is_string(v) && ml && (json_int_t)json_string_length(v) < json_integer_value(ml))
        return fail(c, "string shorter than minLength");
    json_t *any = json_object_get(s, "anyOf");
    if (any) {
        size_t i;
        json_t *e;
        bool ok = false;
        struct qwenrt_error sub;
        json_array_foreach (any, i, e) {
            struct ctx c2 = {.root = c->root, .err = &sub};
            snprintf(c2.path, sizeof(c2.path), "%s", c->path);
            ok |= check(&c2, e, v, depth + 1) == QWENRT_OK;
        }
        if (!ok)
            return fail(c, "matches none of anyOf");
    }
    if (json_is_object(v))
        return check_object(c, s, v, depth);
    if (json_is_array(v)) {
        json_t *items = json_object_get(s, "items"), *mi = json_object_get(s, "minItems");
        if (mi && (json_int_t)json_array_size(v) < json_integer_value(mi))
            return fail(c, "fewer items than minItems");
        size_t i;
        json_t *e;
        json_array_foreach (v, i, e)
            if (items && check_child(c, items, e, NULL, (long)i, depth))
                return c->err->status;
    }
    return QWENRT_OK;
}

qwenrt_status json_schema_check(json_t *schema, json_t *doc, struct qwenrt_error *err)
{
    struct ctx c = {.root = schema, .err = err};
    snprintf(c.path, sizeof(c.path), "$");
    return check(&c, schema, doc, 0);
}
