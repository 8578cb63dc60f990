/*
 * tool_setup.c — loading a model with a profile or the reference binding (see tool_setup.h).
 */
#include "tools/tool_setup.h"

#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "source_digests.h"

const char *tool_profiles_dir(const char *flag)
{
    if (flag)
        return flag;
    if (access("profiles/default.json", R_OK) == 0)
        return "profiles";
    return QWENRT_SOURCE_DIR "/profiles";
}

qwenrt_status tool_load_profile(const char *profile, const char *dir, struct profile **out,
                                struct qwenrt_error *err)
{
    dir = tool_profiles_dir(dir);
    if (!profile) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/default.json", dir);
        if (access(path, R_OK) != 0)
            return profile_default(out, err);
        profile = "profiles/default";
    }
    return profile_load(profile, dir, out, err);
}

qwenrt_status tool_open(const struct tool_open_params *pr, struct tool_model *t,
                        struct qwenrt_error *err)
{
    memset(t, 0, sizeof(*t));
    const char *backend = pr->backend ? pr->backend : "cpu";
    if (strcmp(backend, "cpu") && !(strcmp(backend, "cuda") == 0 && cuda_backend_compiled()))
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "backend '%s' is not available to %s in this build (cpu%s is)", backend,
                       pr->command, cuda_backend_compiled() ? ", cuda" : "");
    t->cpu_features = cpu_features_detect();
    qwenrt_status st = QWENRT_OK;
    if (!pr->reference) {
        st = tool_load_profile(pr->profile, pr->profiles_dir, &t->profile, err);
        if (!st)
            st = profile_check_intent(t->profile, pr->command, pr->intent, err);
        if (st)
            goto out_fail;
    }
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = pr->n_threads;
    mp.keep_layer_types = pr->keep_layer_types;
    mp.backend = backend;
    if ((st = qwenrt_model_load(pr->model_path, &mp, &t->model, err)))
        goto out_fail;
    st = pr->reference
             ? profile_bind_reference(t->model->plans, &t->binding, err)
             : profile_bind(t->profile, t->model->plans, t->cpu_features, &t->binding, err);
    if (st)
        goto out_fail;
    profile_apply(&t->binding, t->model->plans);
    if (!pr->reference)
        t->model->cuda_tuning = t->profile->cuda; /* CUDA sessions read it (session.c) */
    return QWENRT_OK;
out_fail:
    tool_close(t);
    return st;
}

void tool_close(struct tool_model *t)
{
    if (!t)
        return;
    profile_binding_free(&t->binding);
    profile_free(t->profile);
    qwenrt_model_free(t->model);
    memset(t, 0, sizeof(*t));
}
