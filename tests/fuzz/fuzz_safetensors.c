/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader: safetensors_open on the
 * input, then every tensor view is checked to lie inside the mapping and be findable by name.
 * Seeds: tests/fuzz/corpus/fuzz_safetensors/.
 */
#include "fuzz_util.h"

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write("in.safetensors", data, size);
    struct safetensors_file sf;
    struct qwenrt_error err = {0};
    if (safetensors_open(&sf, path, &err) != QWENRT_OK)
        return 0;
    uint64_t h = 0;
    for (int32_t i = 0; i < sf.n_tensors; i++) {
        const struct qr_tensor *t = &sf.tensors[i];
        fuzz_check(t->name != NULL);
        fuzz_check(safetensors_find(&sf, t->name) != NULL);
        if (t->nbytes) {
            const uint8_t *p = t->data;
            fuzz_check(p >= sf.map.data && p + t->nbytes <= sf.map.data + sf.map.size);
            h += p[0] + p[t->nbytes - 1];
        }
    }
    fuzz_sink = h;
    safetensors_close(&sf);
    return 0;
}
