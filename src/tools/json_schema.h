/*
 * json_schema.h — a small JSON Schema checker for the record schemas in docs/schemas/.
 *
 * Supports the subset those schemas use: type (a name or a list; "integer" accepts integers,
 * "number" accepts both), properties, required, additionalProperties (bool or schema), items,
 * minItems, enum, const, minimum, maximum, minLength, anyOf, and local $ref ("#/$defs/name").
 * Unknown keywords are ignored, as JSON Schema says.
 */
#ifndef QWENRT_TOOLS_JSON_SCHEMA_H
#define QWENRT_TOOLS_JSON_SCHEMA_H

#include <jansson.h>

#include "qwenrt.h"

/* Checks doc against schema; the error names the first violation by JSON path, e.g.
 * "$.lanes[0].median.ttft_s: expected number, got string". Errors: FORMAT (violation),
 * INVALID_ARG (an unresolvable $ref). */
qwenrt_status json_schema_check(json_t *schema, json_t *doc, struct qwenrt_error *err);

#endif
