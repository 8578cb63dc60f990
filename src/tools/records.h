/*
 * records.h — the parts every JSON record (validate, bench, calibrate) shares: environment
 * (hardware, software, compiler), source and kernel digests embedded at build time
 * (cmake/source_digests.cmake), model identity (file sha256, geometry, parameter count), the
 * profile, and writing a record (sorted keys, 2-space indent, tmp + rename).
 *
 * Two records of the same run differ only in created_at and timings: nothing here reads the
 * clock except records_now, and maps are written with sorted keys.
 */
#ifndef QWENRT_TOOLS_RECORDS_H
#define QWENRT_TOOLS_RECORDS_H

#include <jansson.h>

#include "model/model.h"
#include "runtime/profile.h"

#define RECORDS_SCHEMA_VERSION 1

/* ISO-8601 UTC time with microseconds, e.g. "2026-10-04T22:52:24.342476+00:00". */
void records_now(char out[40]);

/* The source file whose sha256 is a kernel key's digest, and that digest (NULL when unknown).
 * The file is "src/backend/cpu/" + "*" (a digest over that directory) when no file matches. */
const char *records_kernel_source(const char *key, char *buf, size_t len);
const char *records_kernel_digest(const char *key, char out[65]);

/* Adds hardware, software, compiler, source_sha256, compiler_and_kernels_sha256. */
void records_add_environment(json_t *rec);
/* {key: {sha256, source}} for every key bound in b. */
json_t *records_kernels(const struct profile_binding *b);
/* The kernels of a backend other than the CPU's (whose op keys do not apply there):
 * {"<backend>": {sha256 over src/backend/<backend>/, source}}. */
json_t *records_backend_kernels(const char *backend);
/* Adds hardware.gpu ("NVIDIA H200, 139 GiB, cc 9.0") for a run on the CUDA backend. */
void records_add_gpu(json_t *rec);
/* Adds model, checkpoint_sha256 (each file of the model), geometry, parameter_count.
 * capacity and threads go into geometry as in seed 004. */
qwenrt_status records_add_model(json_t *rec, const struct qwenrt_model *m, int32_t capacity,
                                int threads, struct qwenrt_error *err);
/* {id, sha256, chain, resolved} (null for the reference path). */
json_t *records_profile(const struct profile *p);

/* Writes rec to path (sorted keys, indent 2, trailing newline) via a temporary file. */
qwenrt_status records_write(const json_t *rec, const char *path, struct qwenrt_error *err);

#endif
