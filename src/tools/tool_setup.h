/*
 * tool_setup.h — what validate, bench, calibrate and `profile show -m` share: loading a model
 * for a backend, resolving a profile for a command's intent (refusing incompatible ones), and
 * binding the model's plans to kernels, either under the profile or on the reference path.
 *
 * Each struct tool_model owns its own model load: the binding is written into the model's
 * plans (op->kernel), so a candidate and the reference path need two loads (the weights are
 * mapped, not copied, so the second load costs little).
 */
#ifndef QWENRT_TOOLS_TOOL_SETUP_H
#define QWENRT_TOOLS_TOOL_SETUP_H

#include "model/model.h"
#include "runtime/profile.h"

struct tool_model {
    struct qwenrt_model *model;
    struct profile *profile; /* NULL on the reference path */
    struct profile_binding binding;
    uint32_t cpu_features;
};

struct tool_open_params {
    const char *model_path;
    const char *backend;      /* "cpu" (NULL = cpu) */
    int n_threads;            /* 0 = all cores */
    const char *profile;      /* id or file; NULL = profiles/default (built in when absent) */
    const char *profiles_dir; /* NULL = tool_profiles_dir(NULL) */
    const char *command;      /* for intent errors: "bench", "validate", ... */
    unsigned intent;          /* PROFILE_INTENT_* of the command */
    bool reference;           /* bind every op to its *.ref kernel instead of the profile */
    bool keep_layer_types;    /* qwenrt_model_params.keep_layer_types */
};

qwenrt_status tool_open(const struct tool_open_params *params, struct tool_model *out,
                        struct qwenrt_error *err);
void tool_close(struct tool_model *t);

/* Resolves a profile alone (no model): for `profile show/check` and records. */
qwenrt_status tool_load_profile(const char *profile, const char *dir, struct profile **out,
                                struct qwenrt_error *err);

/* The profiles directory: `flag` when given, else ./profiles when it exists, else the
 * profiles/ of the source tree this program was built from. */
const char *tool_profiles_dir(const char *flag);

#endif
