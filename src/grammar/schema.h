/*
 * schema - JSON Schema to a GBNF grammar (schema.c has what is supported and refused).
 */
#ifndef WELD_GRAMMAR_SCHEMA_H
#define WELD_GRAMMAR_SCHEMA_H

#include "core/err.h"

#include <stddef.h>

/* The GBNF text (start rule "root") of the JSON documents schema text[0, len) allows,
   white space included; *gbnf is allocated (wfree it). Errors name the keyword and its
   path in the schema. */
int grammar_gbnf_from_json_schema(const char *text, size_t len, char **gbnf, struct weld_err *e);

#endif
