/*
 * fuzz_profile.c — libFuzzer target for runtime profiles (profile JSON): the input is written
 * as fuzz.json in a scratch directory that is also the profile search directory (so "extends"
 * can only name itself or missing ids), loaded with profile_load, then bound to the vocabulary
 * plans (one op of every kind) with profile_bind and described with profile_report.
 * Seeds: tests/fuzz/corpus/fuzz_profile/ (the files in profiles/ and variants).
 */
#include "fuzz_util.h"

#include "base/cpu_features.h"
#include "runtime/profile.h"

static struct plan plans[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct qwenrt_error err = {0};
    if (profile_vocabulary_plans(plans, &err) != QWENRT_OK) {
        fprintf(stderr, "fuzz_profile: %s\n", err.message);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write("fuzz.json", data, size);
    struct profile *p = NULL;
    struct qwenrt_error err = {0};
    if (profile_load(path, fuzz_dir(), &p, &err) != QWENRT_OK) {
        fuzz_check(p == NULL);
        return 0;
    }
    struct profile_binding b;
    memset(&b, 0, sizeof(b));
    /* every feature bit set, then none: both binding paths (native and remap/refuse) */
    for (int pass = 0; pass < 2; pass++) {
        if (profile_bind(p, plans, pass ? 0u : ~0u, &b, &err) == QWENRT_OK) {
            json_t *r = profile_report(p, &b, plans);
            json_decref(r);
        }
        profile_binding_free(&b);
        memset(&b, 0, sizeof(b));
    }
    (void)profile_check_intent(p, "run", PROFILE_INTENT_INVESTIGATE, &err);
    profile_free(p);
    return 0;
}
