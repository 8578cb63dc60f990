/*
 * main.c — the qwenrt program: dispatches `qwenrt <command> [options]` to src/cli/cmd_*.c.
 *
 * Commands not built yet are weak stubs here that say so; a cmd_<name>.c file that defines the
 * command replaces its stub at link time.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "qwenrt.h"

#define STUB(name)                                                                               \
    __attribute__((weak)) int cmd_##name(int argc, char **argv)                                  \
    {                                                                                            \
        (void)argc;                                                                              \
        (void)argv;                                                                              \
        fprintf(stderr, "qwenrt: '%s' is not available in this build\n", #name);                 \
        return 2;                                                                                \
    }
STUB(info) STUB(logits) STUB(generate) STUB(synth) STUB(bench) STUB(tokenize) STUB(detokenize)
STUB(run) STUB(convert) STUB(compare) STUB(validate) STUB(profile) STUB(calibrate) STUB(card)
STUB(serve)

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate text from a prompt, or chat (-i)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"info", cmd_info, "architecture, geometry, tensors, dtypes, hashes of a model"},
    {"generate", cmd_generate, "greedy-decode token ids"},
    {"logits", cmd_logits, "write the logits of one prefill to a safetensors file"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"synth", cmd_synth, "write a model with deterministic random weights"},
    {"convert", cmd_convert, "convert / quantise a model to GGUF"},
    {"compare", cmd_compare, "KL divergence and top-1 agreement of two models"},
    {"bench", cmd_bench, "prefill and decode speed"},
    {"validate", cmd_validate, "correctness gate against a reference"},
    {"profile", cmd_profile, "list, show and check runtime profiles"},
    {"calibrate", cmd_calibrate, "find the fastest valid profile"},
    {"card", cmd_card, "gather records into a model card"},
};

static void usage(FILE *f)
{
    fprintf(f, "qwenrt %s — a runtime for small Qwen models\n\nusage: qwenrt <command> [options]\n\n",
            QWENRT_VERSION);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'qwenrt <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("qwenrt %s\n", QWENRT_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "qwenrt: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
