/*
 * cmd_tokenize.c — `qwenrt tokenize` (text to ids) and `qwenrt detokenize` (ids to text).
 *
 *   qwenrt tokenize   (--tokenizer tokenizer.json | -m MODEL) (--text T | --file F | --jsonl F)
 *   qwenrt detokenize (--tokenizer tokenizer.json | -m MODEL) (--ids 1,2,3 | --jsonl F)
 *
 * MODEL is a GGUF file (its tokenizer.ggml.* metadata) or a Hugging Face directory (its
 * tokenizer.json). tokenize prints the ids comma-separated on one line (special tokens in the
 * text are recognised; --file and stdin take raw bytes). With --jsonl, each input line
 * {"text": ...} gives an output line {"ids": [...]} (detokenize: {"ids": [...]} gives
 * {"text": ...}), in order.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

struct tok_opts {
    const char *tokenizer; /* --tokenizer */
    const char *model;     /* -m */
    const char *text;      /* --text */
    const char *file;      /* --file */
    const char *jsonl;     /* --jsonl */
    const char *ids;       /* --ids */
};

static int usage(const char *cmd)
{
    if (!strcmp(cmd, "tokenize"))
        fprintf(stderr, "usage: qwenrt tokenize (--tokenizer tokenizer.json | -m MODEL) "
                        "(--text TEXT | --file FILE | --jsonl FILE)\n"
                        "  prints the ids comma-separated; --jsonl reads {\"text\": ...} lines "
                        "and writes {\"ids\": [...]} lines; no input option: stdin\n");
    else
        fprintf(stderr, "usage: qwenrt detokenize (--tokenizer tokenizer.json | -m MODEL) "
                        "(--ids 1,2,3 | --jsonl FILE)\n"
                        "  prints the text; --jsonl reads {\"ids\": [...]} lines and writes "
                        "{\"text\": ...} lines\n");
    return 2;
}

static int parse_opts(int argc, char **argv, struct tok_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], **dst = NULL;
        if (!strcmp(a, "--tokenizer"))
            dst = &o->tokenizer;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            dst = &o->model;
        else if (!strcmp(a, "--text") || !strcmp(a, "-p"))
            dst = &o->text;
        else if (!strcmp(a, "--file"))
            dst = &o->file;
        else if (!strcmp(a, "--jsonl"))
            dst = &o->jsonl;
        else if (!strcmp(a, "--ids"))
            dst = &o->ids;
        if (!dst || !(*dst = cli_value(argc, argv, &i)))
            return -1;
    }
    return (o->tokenizer || o->model) ? 0 : -1;
}

/* The tokenizer of --tokenizer, or of -m (a GGUF file or a Hugging Face directory). */
static struct tokenizer *load_tokenizer(const struct tok_opts *o)
{
    struct qwenrt_error err = {0};
    struct tokenizer *tok = NULL;
    struct stat sb;
    qwenrt_status st;
    if (o->tokenizer) {
        st = tokenizer_load_json(&tok, o->tokenizer, &err);
    } else if (stat(o->model, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char *path = NULL;
        if ((st = tokenizer_find_json(o->model, &path, &err)) == QWENRT_OK)
            st = tokenizer_load_json(&tok, path, &err);
        xfree(path);
    } else {
        struct gguf_file gf = {0};
        if ((st = gguf_open(&gf, o->model, &err)) == QWENRT_OK) {
            st = tokenizer_load_gguf(&tok, &gf, &err);
            gguf_close(&gf);
        }
    }
    if (st != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        return NULL;
    }
    return tok;
}

static void print_ids(FILE *f, const int32_t *ids, size_t n, const char *sep)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? sep : "", ids[i]);
}

static int encode_print(const struct tokenizer *tok, const char *text, size_t len)
{
    int32_t *ids;
    size_t n;
    struct qwenrt_error err = {0};
    if (tokenizer_encode(tok, text, len, &ids, &n, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        return 1;
    }
    print_ids(stdout, ids, n, ",");
    putchar('\n');
    xfree(ids);
    return 0;
}

/* Reads all of f (raw bytes). */
static char *read_stream(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0, r;
    char *buf = xmalloc(cap, 1);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *p = xrealloc(buf, cap *= 2, 1);
            if (!p)
                xfree(buf);
            buf = p;
        }
    }
    *len = n;
    return buf;
}

/* One JSON line in, one out; handle() turns the parsed line into the output object. */
typedef json_t *(*jsonl_fn)(const struct tokenizer *tok, json_t *in, char *why, size_t n);

static int run_jsonl(const struct tokenizer *tok, const char *path, jsonl_fn handle)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "qwenrt: %s: cannot open\n", path);
        return 1;
    }
    char *line = NULL, why[256];
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t je;
        json_t *in = json_loads(line, 0, &je), *out = NULL;
        snprintf(why, sizeof(why), "%s", in ? "" : je.text);
        if (in)
            out = handle(tok, in, why, sizeof(why));
        json_decref(in);
        if (!out) {
            fprintf(stderr, "qwenrt: %s: line %ld: %s\n", path, lineno, why);
            rc = 1;
            break;
        }
        char *s = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(out);
        if (s)
            puts(s);
        free(s);
    }
    free(line);
    if (f != stdin)
        fclose(f);
    return rc;
}

static json_t *jsonl_encode(const struct tokenizer *tok, json_t *in, char *why, size_t n)
{
    json_t *text = json_object_get(in, "text");
    if (!json_is_string(text)) {
        snprintf(why, n, "expected {\"text\": \"...\"}");
        return NULL;
    }
    int32_t *ids;
    size_t ni;
    struct qwenrt_error err = {0};
    if (tokenizer_encode(tok, json_string_value(text), json_string_length(text), &ids, &ni, &err) !=
        QWENRT_OK) {
        snprintf(why, n, "%s", err.message);
        return NULL;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < ni; i++)
        json_array_append_new(arr, json_integer(ids[i]));
    xfree(ids);
    return json_pack("{s:o}", "ids", arr);
}

static json_t *jsonl_decode(const struct tokenizer *tok, json_t *in, char *why, size_t n)
{
    json_t *arr = json_object_get(in, "ids"), *v;
    size_t ni = json_array_size(arr), i;
    if (!json_is_array(arr)) {
        snprintf(why, n, "expected {\"ids\": [...]}");
        return NULL;
    }
    int32_t *ids = xmalloc(ni + 1, sizeof(*ids));
    json_array_foreach(arr, i, v) ids[i] = json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
    char *text;
    size_t len;
    struct qwenrt_error err = {0};
    qwenrt_status st = tokenizer_decode(tok, ids, ni, &text, &len, &err);
    xfree(ids);
    if (st != QWENRT_OK) {
        snprintf(why, n, "%s", err.message);
        return NULL;
    }
    json_t *out = json_pack("{s:s%}", "text", text, len);
    xfree(text);
    return out;
}

int cmd_tokenize(int argc, char **argv)
{
    struct tok_opts o = {0};
    if (parse_opts(argc, argv, &o) < 0 || o.ids || (!!o.text + !!o.file + !!o.jsonl) > 1)
        return usage("tokenize");
    struct tokenizer *tok = load_tokenizer(&o);
    if (!tok)
        return 1;
    int rc;
    if (o.jsonl) {
        rc = run_jsonl(tok, o.jsonl, jsonl_encode);
    } else if (o.text) {
        rc = encode_print(tok, o.text, strlen(o.text));
    } else {
        FILE *f = o.file ? fopen(o.file, "rb") : stdin;
        size_t len = 0;
        char *buf = f ? read_stream(f, &len) : NULL;
        if (f && f != stdin)
            fclose(f);
        if (!buf)
            fprintf(stderr, "qwenrt: %s: cannot read\n", o.file ? o.file : "stdin");
        rc = buf ? encode_print(tok, buf, len) : 1;
        xfree(buf);
    }
    tokenizer_free(tok);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    struct tok_opts o = {0};
    if (parse_opts(argc, argv, &o) < 0 || o.text || o.file || !!o.ids == !!o.jsonl)
        return usage("detokenize");
    struct tokenizer *tok = load_tokenizer(&o);
    if (!tok)
        return 1;
    int rc = 1;
    if (o.jsonl) {
        rc = run_jsonl(tok, o.jsonl, jsonl_decode);
    } else {
        int32_t *ids = NULL, n = 0;
        char *text;
        size_t len;
        struct qwenrt_error err = {0};
        if (!cli_parse_ids(o.ids, &ids, &n)) {
            rc = 2;
        } else if (tokenizer_decode(tok, ids, (size_t)n, &text, &len, &err) != QWENRT_OK) {
            fprintf(stderr, "qwenrt: %s\n", err.message);
        } else {
            fwrite(text, 1, len, stdout);
            putchar('\n');
            xfree(text);
            rc = 0;
        }
        free(ids);
    }
    tokenizer_free(tok);
    return rc;
}
