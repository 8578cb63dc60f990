/*
 * card.h — model cards (seed 003): gathers the validate, bench and calibrate records of a
 * directory into one card (model, conversion, artifacts with sha256, validations, benchmarks,
 * device records copied verbatim with their source path, pitfalls written by a person) and a
 * Markdown summary. Files are read in name order and keys are sorted, so the same records give
 * the same card.
 */
#ifndef QWENRT_TOOLS_CARD_H
#define QWENRT_TOOLS_CARD_H

#include <jansson.h>

#include "qwenrt.h"

struct card_params {
    const char *records_dir;
    const char *id;      /* model id (NULL: from the records) */
    const char *license; /* NULL: null in the card */
    const char *source_url;
    const char *conversion; /* how the artifact was made, free text (NULL: null) */
    const char *pitfalls;   /* a text file, one pitfall per line (NULL: none) */
};

qwenrt_status card_build(const struct card_params *p, json_t **card, struct qwenrt_error *err);
/* The Markdown summary of a card. */
qwenrt_status card_write_markdown(const json_t *card, const char *path, struct qwenrt_error *err);

#endif
