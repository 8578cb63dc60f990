/*
 * cli_common.h — what every sub-command shares: option parsing helpers, the common model
 * options (-m, --threads, --backend), loading a model with a readable error, id lists.
 */
#ifndef QWENRT_CLI_COMMON_H
#define QWENRT_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "qwenrt.h"

struct cli_model_opts {
    const char *model;   /* -m / --model */
    int threads;         /* --threads, 0 = all cores */
    const char *backend; /* --backend cpu|cuda */
    int32_t ctx;         /* --ctx-size */
    const char *profile; /* --profile ID|FILE: kernels bound by a runtime profile */
    int32_t precision;   /* --precision default|exact: enum qwenrt_precision */
    int32_t kv_type;     /* --kv-type default|f32|f16: enum qwenrt_kv_type */
    const char *command; /* the command's name, for intent errors ("run", "serve", ...) */
    bool keep_layer_types; /* --keep-layer-types: qwenrt_model_params.keep_layer_types */
};

/* If argv[*i] is one of the common model options, consumes it (and its value) and returns 1;
 * returns 0 when it is not one, -1 on a missing or bad value (message printed). */
int cli_parse_model_opt(struct cli_model_opts *o, int argc, char **argv, int *i);

/* The value after option argv[*i] (advances *i), or NULL with a message when missing. */
const char *cli_value(int argc, char **argv, int *i);

/* Strict integer parsing: false (with a message naming opt) unless s is an integer in range. */
bool cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);

/* The same for int fields (option values of bench, validate, calibrate). */
bool cli_parse_int_arg(const char *opt, const char *s, int lo, int hi, int *out);

/* A non-negative 64-bit integer (seeds); false with a message naming opt otherwise. */
bool cli_parse_u64(const char *opt, const char *s, uint64_t *out);

/* The options bench, validate and calibrate share, as getopt letters: -m model, -b backend,
 * -P profile, -p prompt tokens, -n generated tokens, -t threads, -s seed, -d profiles dir,
 * -w warmup, -r trials. A NULL field means the command has no such option (it may use the
 * letter itself, handled before this). */
struct cli_run_opts {
    const char **model, **backend, **profile, **profiles_dir;
    int *n_prompt, *n_gen, *n_threads, *warmup, *trials;
    uint64_t *seed;
};

/* Handles getopt result c with arg: 1 when it is a shared option (value stored), 0 when it is
 * not, -1 on a bad value (message printed, naming the option). */
int cli_run_opt(const struct cli_run_opts *o, int c, const char *arg);

/* Parses "1,2,3" into a new array (free with free()); false with a message on bad input. */
bool cli_parse_ids(const char *s, int32_t **ids, int32_t *n);

/* Loads o->model; prints "qwenrt: <message>" and returns NULL on failure. With --profile the
 * profile must allow the investigate intent (run, generate, serve, ...) and binds the model's
 * kernels. */
struct qwenrt_model *cli_load_model(const struct cli_model_opts *o);

/* Creates a session for the model with o's thread and context settings; NULL on failure. */
struct qwenrt_session *cli_new_session(struct qwenrt_model *m, const struct cli_model_opts *o);

#endif
