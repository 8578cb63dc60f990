/*
 * profile.h — runtime profiles (seed 000, Doppler's runtime profile format, read as qwenrt
 * understands it): JSON files in profiles/ or given by path, resolved through their `extends`
 * chain, validated, and turned into a binding of every plan op to a kernel key.
 *
 * Loading: profile_load reads the file, its bases (extends: one id or a list, cycles refused),
 * validates each file's metadata, and merges bases in order with the child last: objects
 * deep-merge, null resets (the key is removed), arrays and scalars replace. The runtime part of
 * the resolved profile is then validated (executionPatch, batching, session.decodeLoop, fusion
 * flags, kernelPathPolicy, and qwenrt's own cudaTuning: the CUDA decode's shapes, which
 * `qwenrt calibrate --backend cuda` measures and writes). Ids resolve as <dir>/<id minus a leading "profiles/">.json.
 *
 * Binding (profile_bind.c): each op of each phase gets a registry key; executionPatch.set
 * entries rewrite the ops they match (matching nothing is an error); kernels that cannot run
 * here (foreign files such as WGSL, missing CPU features, another weight dtype) fail under
 * kernelPathPolicy locked and fall back to the default key under capability-aware + remap,
 * with each remap named. profile_report describes what applies, field by field.
 */
#ifndef QWENRT_RUNTIME_PROFILE_H
#define QWENRT_RUNTIME_PROFILE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "plan/plan.h"
#include "qwenrt.h"

#define PROFILE_MAX_CHAIN 16 /* profiles in one extends chain */

enum profile_intent {
    PROFILE_INTENT_VERIFY = 1 << 0,      /* validate */
    PROFILE_INTENT_INVESTIGATE = 1 << 1, /* run, serve, generate */
    PROFILE_INTENT_CALIBRATE = 1 << 2,   /* bench, calibrate */
};

/* Sections of executionPatch.set (Doppler's execution graph sections). */
enum profile_section {
    SECTION_ANY = -1,
    SECTION_PREFILL = 0, /* = PHASE_PREFILL: layer ops of the prefill plan */
    SECTION_DECODE = 1,  /* = PHASE_DECODE */
    SECTION_PRE_LAYER,   /* global ops before the first layer (embed), both phases */
    SECTION_POST_LAYER,  /* global ops after the last layer (final norm, logits), both phases */
};

struct profile_kernel { /* executionPatch.addKernels[i] */
    char *key;          /* the key set entries use */
    char *kernel;       /* a qwenrt registry key, or a foreign file (e.g. *.wgsl) */
    char *entry;        /* entry point */
    char *digest;       /* "sha256:<64 hex>" */
    char *kv_dtype;     /* precision.kvDtype, or NULL */
};

struct profile_set { /* executionPatch.set[i] */
    int section;     /* enum profile_section */
    char *op;        /* op key, e.g. "attention" */
    char *kernel_key;
};

struct profile_decode_loop { /* session.decodeLoop, else batching (requested cadence) */
    bool given;
    int32_t batch_size;        /* decode steps per submission */
    int32_t readback_interval; /* submissions between readbacks */
    int32_t max_batch_decode_tokens;
    int32_t ring_tokens, ring_stop, ring_staging;
    char stop_check_mode[16]; /* "batch" | "per-token" */
    char readback_mode[16];   /* "sequential" | "overlapped" | "auto" */
};

struct profile {
    json_t *doc;                    /* the resolved (merged) profile */
    char *id;                       /* id of the profile asked for */
    char *path;                     /* its file */
    char *chain[PROFILE_MAX_CHAIN]; /* ids in merge order: bases first, this one last */
    int n_chain;
    unsigned intent;                /* one PROFILE_INTENT_* */
    unsigned compatible;            /* PROFILE_INTENT_* bits */
    char sha256[65];                /* of the resolved profile, compact with sorted keys */
    struct profile_kernel *kernels; /* [n_kernels] */
    int n_kernels;
    struct profile_set *sets; /* [n_sets] */
    int n_sets;
    struct profile_decode_loop decode;
    struct model_cuda_tuning cuda;  /* runtime.inference.cudaTuning (zeros: none); tool_open
                                     * puts it into the model for CUDA sessions */
    bool cuda_given;
    bool capability_aware; /* kernelPathPolicy.mode */
    bool remap;            /* kernelPathPolicy.onIncompatible == "remap" */
    bool remap_in_scope;   /* sourceScope allows remapping the execution graph */
    json_t *warnings;      /* array of strings (merge type mismatches) */
};

/* Loads and resolves `id_or_path` (a file path, or an id looked up in dir). */
qwenrt_status profile_load(const char *id_or_path, const char *dir, struct profile **out,
                           struct qwenrt_error *err);
void profile_free(struct profile *p);

/* A built-in profile equal to profiles/default.json (used when no profile is named). */
qwenrt_status profile_default(struct profile **out, struct qwenrt_error *err);

/* "verify" -> PROFILE_INTENT_VERIFY ...; 0 when unknown. */
unsigned profile_intent_from_name(const char *name);
const char *profile_intent_name(unsigned intent);

/* Refuses a profile whose compatibleIntents lacks the command's intent. */
qwenrt_status profile_check_intent(const struct profile *p, const char *command, unsigned intent,
                                   struct qwenrt_error *err);

/* Deep merge (exposed for tests): a new value, base overridden by over. warnings may be NULL. */
json_t *profile_merge(json_t *base, json_t *over, const char *path, json_t *warnings);

/* ------------------------------------------------------------------ binding (profile_bind.c) */

struct profile_op_binding {
    const char *key;       /* registry key bound (static string) */
    const char *requested; /* key the profile set (its own spelling), or NULL */
    bool remapped;         /* requested could not run here; key is the fallback */
    const char *why;       /* why it could not (owned by the binding's reasons), or NULL */
};

struct profile_binding {
    struct profile_op_binding *ops[2]; /* [PHASE_*][n_ops] */
    int32_t n_ops[2];
    json_t *remaps;  /* array of one-line descriptions, one per remap */
    json_t *fusions; /* array of {flag, fusion, requested, available, effect} */
    json_t *reasons; /* strings that ops' `why` point into */
};

/* Binds every op of plans[0..1] (prefill, decode). Ops whose weight is NULL (no model) bind
 * matmul ops to the kernel without dtype checks. Errors: unknown key, a set entry matching no
 * op, a kernel of another op, an incompatible kernel or fusion under the locked policy. */
qwenrt_status profile_bind(const struct profile *p, const struct plan plans[2], uint32_t features,
                           struct profile_binding *b, struct qwenrt_error *err);
/* The reference path: every op on its *.ref kernel (matmul.<dtype>.ref). */
qwenrt_status profile_bind_reference(const struct plan plans[2], struct profile_binding *b,
                                     struct qwenrt_error *err);
/* Writes the binding into the plans' op->kernel fields (sessions bind at init). */
void profile_apply(const struct profile_binding *b, struct plan plans[2]);
void profile_binding_free(struct profile_binding *b);

/* A JSON description: resolved profile, chain, sha256, each runtime field with whether it
 * applies here, the binding grouped by phase/op/key, remaps, fusions. New reference. */
json_t *profile_report(const struct profile *p, const struct profile_binding *b,
                       const struct plan plans[2]);

/* Plans with one op of every kind (layer 0, no weights) for binding without a model. */
qwenrt_status profile_vocabulary_plans(struct plan plans[2], struct qwenrt_error *err);

#endif
