/*
 * synth.h — deterministic random-weight models in the exact geometry of real releases, written
 * as llama.cpp GGUF files (for benchmarks and tests without downloading weights).
 */
#ifndef QWENRT_TOOLS_SYNTH_H
#define QWENRT_TOOLS_SYNTH_H

#include <stdint.h>

#include "model/hparams.h"
#include "tools/gguf_export.h"

/* Geometry presets: "qwen3-0.6b", "qwen35-0.8b", "qwen3-tiny", "qwen35-tiny". */
qwenrt_status synth_preset(const char *arch, struct model_hparams *hp, struct qwenrt_error *err);

/* Names of the presets, NULL-terminated. */
const char *const *synth_preset_names(void);

/* Writes a GGUF of preset geometry hp with weights drawn from `seed`. Values depend only on
 * (seed, tensor name), so the same call always writes the same file. */
qwenrt_status synth_write(const char *path, const struct model_hparams *hp, uint64_t seed,
                          const struct export_params *params, struct qwenrt_error *err);

#endif
