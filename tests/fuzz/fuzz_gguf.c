/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader and everything that reads GGUF metadata:
 * gguf_open and its accessors, hparams_from_gguf + hparams_validate, tokenizer_load_gguf,
 * qwenrt_model_load on the same bytes (tensor binding, plans), and model_load_for with the CUDA
 * backend's weight types (Q4_0 and Q5_K matrices converted: quant/transcode.h). Any crash,
 * leak, sanitizer report, or a success that hands out a view outside the file, is a finding.
 * Seeds: tests/fuzz/corpus/fuzz_gguf/ (small valid GGUF files and near misses).
 */
#include "fuzz_util.h"

#include "backend/cuda/cuda_backend.h"
#include "base/alloc.h"
#include "format/gguf.h"
#include "model/hparams.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* Reads every value (recursively) so that lengths and counts are exercised. */
static uint64_t touch_value(const struct gguf_value *v, int depth)
{
    uint64_t h = (uint64_t)v->type;
    if (v->type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++)
            h = h * 31 + (uint8_t)v->v.str.str[i];
        fuzz_check(v->v.str.str[v->v.str.len] == 0);
    } else if (v->type == GGUF_TYPE_ARRAY && depth < 8) {
        for (uint64_t i = 0; i < v->v.arr.count; i++)
            h += touch_value(&v->v.arr.items[i], depth + 1);
    }
    return h;
}

static void run_file(const char *path)
{
    struct gguf_file gf;
    struct qwenrt_error err = {0};
    if (gguf_open(&gf, path, &err) != QWENRT_OK)
        return;
    uint64_t h = 0;
    for (int64_t i = 0; i < gf.n_kv; i++) {
        h += touch_value(&gf.kvs[i].value, 0);
        fuzz_check(gguf_find_kv(&gf, gf.kvs[i].key) != NULL);
    }
    for (int64_t i = 0; i < gf.n_tensors; i++) {
        const struct qr_tensor *t = &gf.tensors[i];
        /* every view lies inside the mapping */
        if (t->nbytes) {
            const uint8_t *p = t->data;
            fuzz_check(p >= gf.map.data && p + t->nbytes <= gf.map.data + gf.map.size);
            h += p[0] + p[t->nbytes - 1];
        }
    }
    int64_t iv;
    double fv;
    bool bv;
    h += gguf_get_int(&gf, "general.alignment", &iv);
    h += gguf_get_float(&gf, "qwen3.rope.freq_base", &fv);
    h += gguf_get_bool(&gf, "tokenizer.ggml.add_bos_token", &bv);
    h += gguf_get_string(&gf, "general.architecture") != NULL;
    h += gguf_get_array(&gf, "tokenizer.ggml.tokens") != NULL;

    struct model_hparams hp;
    memset(&hp, 0, sizeof(hp));
    if (hparams_from_gguf(&hp, &gf, &err) == QWENRT_OK)
        h += hparams_validate(&hp, path, &err) == QWENRT_OK;

    struct tokenizer *tok = NULL;
    if (tokenizer_load_gguf(&tok, &gf, &err) == QWENRT_OK) {
        static const char text[] = "Hello, world! <|im_start|>user\n123 \xe4\xbd\xa0\xe5\xa5\xbd";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tokenizer_encode(tok, text, sizeof(text) - 1, &ids, &n, &err) == QWENRT_OK) {
            char *out = NULL;
            size_t len = 0;
            if (tokenizer_decode(tok, ids, n, &out, &len, &err) == QWENRT_OK)
                xfree(out);
            xfree(ids);
        }
        tokenizer_free(tok);
    }
    fuzz_sink = h;
    gguf_close(&gf);

    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = 1;
    if (qwenrt_model_load(path, &mp, &m, &err) == QWENRT_OK)
        qwenrt_model_free(m);
    if (model_load_for(path, &mp, cuda_weight_dtype_supported, &m, &err) == QWENRT_OK)
        qwenrt_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run_file(fuzz_write("in.gguf", data, size));
    return 0;
}
