/*
 * dtype.c — the table of dtype traits (names and block geometry, from ggml's layouts).
 */
#include "format/dtype.h"

#include <strings.h>

static const struct {
    int32_t id;
    struct qr_dtype_traits t;
} table[] = {
    {QR_F32, {"f32", 1, 4}},      {QR_F16, {"f16", 1, 2}},      {QR_BF16, {"bf16", 1, 2}},
    {QR_Q4_0, {"q4_0", 32, 18}},  {QR_Q4_1, {"q4_1", 32, 20}},  {QR_Q5_0, {"q5_0", 32, 22}},
    {QR_Q5_1, {"q5_1", 32, 24}},  {QR_Q8_0, {"q8_0", 32, 34}},  {QR_Q8_1, {"q8_1", 32, 36}},
    {QR_Q2_K, {"q2_k", 256, 84}}, {QR_Q3_K, {"q3_k", 256, 110}}, {QR_Q4_K, {"q4_k", 256, 144}},
    {QR_Q5_K, {"q5_k", 256, 176}}, {QR_Q6_K, {"q6_k", 256, 210}}, {QR_Q8_K, {"q8_k", 256, 292}},
    {QR_IQ4_NL, {"iq4_nl", 32, 18}}, {QR_IQ4_XS, {"iq4_xs", 256, 136}},
    {QR_I8, {"i8", 1, 1}},        {QR_I16, {"i16", 1, 2}},      {QR_I32, {"i32", 1, 4}},
    {QR_I64, {"i64", 1, 8}},      {QR_F64, {"f64", 1, 8}},      {QR_U8, {"u8", 1, 1}},
    {QR_BOOL, {"bool", 1, 1}},
};

const struct qr_dtype_traits *dtype_traits(int32_t dtype)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (table[i].id == dtype)
            return &table[i].t;
    return NULL;
}

enum qr_dtype dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcasecmp(table[i].t.name, name) == 0)
            return (enum qr_dtype)table[i].id;
    return QR_DTYPE_INVALID;
}

bool dtype_row_bytes(enum qr_dtype t, int64_t n, size_t *out)
{
    const struct qr_dtype_traits *tr = dtype_traits(t);
    if (!tr || n < 0 || n % tr->block_size != 0)
        return false;
    uint64_t blocks = (uint64_t)(n / tr->block_size);
    if (blocks > SIZE_MAX / (uint64_t)tr->type_size)
        return false;
    *out = (size_t)blocks * (size_t)tr->type_size;
    return true;
}
