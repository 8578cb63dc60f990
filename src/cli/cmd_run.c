/*
 * cmd_run.c — `qwenrt run -m MODEL -p "prompt"`: streams the answer as it is generated;
 * `-i` chats interactively and keeps the conversation in the session (each turn processes only
 * its own tokens); `--raw` skips the chat template. Ctrl-C stops the current answer, not the
 * chat; /reset forgets the conversation, /exit (or end of input) leaves.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tokenizer/chat_template.h"
#include "tools/textgen.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

struct run_opts {
    struct cli_model_opts mo;
    const char *prompt, *system;
    bool interactive, raw, thinking, stats;
    struct qwenrt_sampler_params sp;
    struct textgen_params tp;
    int n_stop;
};

static int usage(void)
{
    fprintf(stderr,
            "usage: qwenrt run -m MODEL [-p PROMPT] [-i] [--raw] [--system TEXT] [-n MAX_TOKENS]\n"
            "                  [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
            "                  [--presence-penalty X] [--seed S] [--stop TEXT]... [--think|--no-think]\n"
            "                  [--threads N] [--ctx-size N] [--backend cpu|cuda]\n"
            "                  [--precision default|exact] [--kv-type default|f32|f16]\n"
            "                  [--profile ID|FILE] [--gpu-steps N] [--no-stats] [--keep-layer-types]\n"
            "  --gpu-steps N: tokens drawn per GPU submission where the sampler allows (no penalties\n"
            "                 or bias, top-k below 256): default 16; 1 = token by token\n"
            "  --keep-layer-types: where the backend converts some layer matrices to F16 (Q5_K_M on\n"
            "                 cuda), keep the others as stored (less memory, a slower decode)\n");
    return 2;
}

static bool parse_float(const char *opt, const char *v, float *out)
{
    char *end;
    double d = v ? strtod(v, &end) : 0.0;
    if (!v || end == v || *end) {
        fprintf(stderr, "qwenrt: %s expects a number\n", opt);
        return false;
    }
    *out = (float)d;
    return true;
}

static int parse_sampling(struct run_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    long n;
    if (!strcmp(a, "--temp"))
        return parse_float(a, cli_value(argc, argv, i), &o->sp.temperature) ? 1 : -1;
    if (!strcmp(a, "--top-p"))
        return parse_float(a, cli_value(argc, argv, i), &o->sp.top_p) ? 1 : -1;
    if (!strcmp(a, "--min-p"))
        return parse_float(a, cli_value(argc, argv, i), &o->sp.min_p) ? 1 : -1;
    if (!strcmp(a, "--repeat-penalty"))
        return parse_float(a, cli_value(argc, argv, i), &o->sp.repeat_penalty) ? 1 : -1;
    if (!strcmp(a, "--presence-penalty"))
        return parse_float(a, cli_value(argc, argv, i), &o->sp.presence_penalty) ? 1 : -1;
    const char *v;
    if (!strcmp(a, "--top-k")) {
        if (!(v = cli_value(argc, argv, i)) || !cli_parse_int(a, v, 0, 1 << 30, &n))
            return -1;
        o->sp.top_k = (int32_t)n;
        return 1;
    }
    if (!strcmp(a, "--seed")) {
        if (!(v = cli_value(argc, argv, i)) || !cli_parse_int(a, v, 0, 0x7fffffffL, &n))
            return -1;
        o->sp.seed = (uint64_t)n;
        return 1;
    }
    if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
        if (!(v = cli_value(argc, argv, i)) || !cli_parse_int(a, v, 1, 1 << 22, &n))
            return -1;
        o->tp.max_tokens = (int32_t)n;
        return 1;
    }
    if (!strcmp(a, "--gpu-steps")) {
        if (!(v = cli_value(argc, argv, i)) || !cli_parse_int(a, v, 1, TEXTGEN_GPU_STEPS_MAX, &n))
            return -1;
        o->tp.gpu_steps = (int32_t)n;
        return 1;
    }
    if (!strcmp(a, "--stop")) {
        if (!(v = cli_value(argc, argv, i)) || o->n_stop >= TEXTGEN_MAX_STOP)
            return -1;
        o->tp.stop[o->n_stop++] = v;
        return 1;
    }
    return 0;
}

static int parse_args(struct run_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_model_opt(&o->mo, argc, argv, &i);
        if (!r)
            r = parse_sampling(o, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r)
            continue;
        if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && (o->prompt = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--system") && (o->system = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "-i") || !strcmp(a, "--interactive"))
            o->interactive = true;
        else if (!strcmp(a, "--raw"))
            o->raw = true;
        else if (!strcmp(a, "--think"))
            o->thinking = true;
        else if (!strcmp(a, "--no-think"))
            o->thinking = false;
        else if (!strcmp(a, "--no-stats"))
            o->stats = false;
        else
            return usage();
    }
    if (!o->mo.model || (!o->prompt && !o->interactive))
        return usage();
    return 0;
}

static bool emit_stdout(void *user, const char *text, size_t len)
{
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

struct chat {
    struct qwenrt_session *s;
    struct qwenrt_sampler *smp;
    struct tokenizer *tok;
    enum chat_format fmt;
    struct run_opts *o;
    bool turn_open;       /* the last answer has no end-of-turn in the session yet */
    int32_t pending_eos;  /* the EOS token that ended the last answer, not yet in the session */
};

/* The text that starts a user turn: the whole conversation so far for the first turn, only
 * the new turn afterwards (the session already holds the rest). */
static qwenrt_status turn_text(struct chat *c, const char *user_msg, char **out, struct qwenrt_error *err)
{
    if (c->o->raw) {
        *out = xstrdup(user_msg);
        return *out ? QWENRT_OK : QWENRT_ERR_NOMEM;
    }
    struct chat_message msgs[2];
    size_t n = 0;
    bool first = qwenrt_session_n_past(c->s) == 0;
    if (first && c->o->system)
        msgs[n++] = (struct chat_message){.role = "system", .content = c->o->system};
    msgs[n++] = (struct chat_message){.role = "user", .content = user_msg};
    struct chat_params p = {.messages = msgs, .n_messages = n, .add_generation_prompt = true,
                            .enable_thinking = c->o->thinking};
    char *body = NULL;
    size_t len;
    qwenrt_status st = chat_render(c->fmt, &p, &body, &len, err);
    if (st)
        return st;
    const char *pre = first ? "" : (c->turn_open ? "<|im_end|>\n" : "\n");
    *out = xmalloc(strlen(pre) + len + 1, 1);
    if (*out)
        sprintf(*out, "%s%s", pre, body);
    xfree(body);
    return *out ? QWENRT_OK : QWENRT_ERR_NOMEM;
}

static int chat_turn(struct chat *c, const char *user_msg)
{
    struct qwenrt_error err = {0};
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    qwenrt_status st = QWENRT_OK;
    if (c->pending_eos >= 0 && (st = qwenrt_session_decode(c->s, c->pending_eos, &err)))
        goto out;
    c->pending_eos = -1;
    if ((st = turn_text(c, user_msg, &text, &err)) || (st = tokenizer_encode(c->tok, text, strlen(text), &ids, &n, &err)))
        goto out;
    struct textgen_result r;
    interrupted = 0;
    st = textgen_run(c->s, c->smp, c->tok, ids, (int32_t)n, &c->o->tp, emit_stdout, NULL, &interrupted, &r, &err);
    if (st)
        goto out;
    c->turn_open = r.finish != TEXTGEN_EOS;
    if (r.finish == TEXTGEN_EOS)
        c->pending_eos = r.last_token;
    else if (r.n_generated > 0) /* the last sampled token is not in the session yet */
        st = qwenrt_session_decode(c->s, r.last_token, &err);
    printf("\n");
    fflush(stdout); /* the stats line goes to stderr: keep it after the answer */
    if (c->o->stats)
        fprintf(stderr, "[prompt %d tokens %.1f tok/s | answer %d tokens %.1f tok/s | %s]\n", r.n_prompt,
                r.prefill_s > 0 ? r.n_prompt / r.prefill_s : 0.0, r.n_generated,
                r.decode_s > 0 ? r.n_generated / r.decode_s : 0.0,
                r.finish == TEXTGEN_EOS ? "end of turn" : r.finish == TEXTGEN_STOP ? "stop string"
                : r.finish == TEXTGEN_CANCEL ? "interrupted" : "length limit");
out:
    if (st)
        fprintf(stderr, "qwenrt: %s\n", err.message);
    xfree(text);
    xfree(ids);
    return st ? 1 : 0;
}

static int interactive_loop(struct chat *c)
{
    char line[65536];
    if (c->o->prompt && chat_turn(c, c->o->prompt))
        return 1;
    for (;;) {
        if (isatty(0))
            fprintf(stderr, "> ");
        interrupted = 0;
        if (!fgets(line, sizeof(line), stdin))
            return 0; /* end of input, or Ctrl-C at the prompt */
        line[strcspn(line, "\n")] = '\0';
        if (!strcmp(line, "/exit"))
            return 0;
        if (!strcmp(line, "/reset")) {
            qwenrt_session_reset(c->s);
            qwenrt_sampler_reset(c->smp);
            c->turn_open = false;
            c->pending_eos = -1;
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (!line[0])
            continue;
        if (chat_turn(c, line))
            return 1;
    }
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {.stats = true, .sp = qwenrt_sampler_default_params(), .mo.command = "run"};
    /* llama.cpp-like defaults unless the model's generation_config.json says otherwise */
    o.sp.temperature = 0.8f;
    o.sp.top_k = 40;
    o.sp.top_p = 0.95f;
    o.sp.min_p = 0.05f;
    o.sp.seed = (uint64_t)time(NULL);
    o.tp.max_tokens = 512;
    o.tp.skip_special = true;
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage();
        return 0;
    }
    struct qwenrt_model *m = NULL;
    struct chat c = {.o = &o, .pending_eos = -1};
    struct qwenrt_error err = {0};
    int rc = parse_args(&o, argc, argv);
    if (rc || !(m = cli_load_model(&o.mo)))
        return rc ? rc : 1;
    rc = 1;
    struct run_opts given = o; /* re-parse so command-line flags win over generation_config */
    textgen_generation_defaults(m, &o.sp);
    parse_args(&o, argc, argv);
    (void)given;
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    if (textgen_load_tokenizer(m, &c.tok, &err) || qwenrt_sampler_init(&o.sp, info.n_vocab, &c.smp, &err)) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        goto out;
    }
    if (!(c.s = cli_new_session(m, &o.mo)))
        goto out;
    const char *warning = NULL;
    c.fmt = chat_format_detect(tokenizer_chat_template(c.tok), &warning);
    if (warning && !o.raw)
        fprintf(stderr, "qwenrt: %s\n", warning);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt ends fgets */
    sigaction(SIGINT, &sa, NULL);
    rc = o.interactive ? interactive_loop(&c) : chat_turn(&c, o.prompt);
out:
    qwenrt_sampler_free(c.smp);
    tokenizer_free(c.tok);
    qwenrt_session_free(c.s);
    qwenrt_model_free(m);
    return rc;
}
