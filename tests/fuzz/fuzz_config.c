/*
 * fuzz_config.c — libFuzzer target for Hugging Face config.json parsing:
 * hparams_from_hf_config on the input text, then hparams_validate on what it accepted.
 * Seeds: tests/fuzz/corpus/fuzz_config/ (the fixtures' config.json files and variants).
 */
#include "fuzz_util.h"

#include "model/hparams.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_strdup(data, size);
    struct model_hparams hp;
    memset(&hp, 0, sizeof(hp));
    struct qwenrt_error err = {0};
    if (hparams_from_hf_config(&hp, text, "config.json", &err) == QWENRT_OK &&
        hparams_validate(&hp, "config.json", &err) == QWENRT_OK) {
        /* accepted geometry is self-consistent */
        fuzz_check(hp.n_layer > 0 && hp.n_layer <= QR_MAX_LAYERS);
        fuzz_check(hp.n_embd > 0 && hp.n_vocab > 0 && hp.n_head > 0 && hp.n_head_kv > 0);
    }
    fuzz_check(memchr(err.message, 0, sizeof(err.message)) != NULL);
    free(text);
    return 0;
}
