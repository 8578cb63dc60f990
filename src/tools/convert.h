/*
 * convert.h — `qwenrt convert`: any model qwenrt loads (HF directory or GGUF) to a
 * llama.cpp-compatible GGUF of the chosen type (f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m,
 * q6_k). Quantised inputs are dequantised and requantised.
 */
#ifndef QWENRT_TOOLS_CONVERT_H
#define QWENRT_TOOLS_CONVERT_H

#include "qwenrt.h"
#include "tools/gguf_export.h"

/* params->tokenizer_json / tokenizer_gguf may be left NULL: the tokenizer next to the model
 * (HF tokenizer.json) or inside it (GGUF) is used when present. */
qwenrt_status convert_model(const struct qwenrt_model *m, const char *out_path,
                            struct export_params *params, struct qwenrt_error *err);

#endif
